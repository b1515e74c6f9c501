"""The one-launch qk-norm (ops/triton_qk_norm.py) against reference.rms_norm on q and k apart, and
the Qwen3 attention that uses it against the same module unfused. CUDA, else Triton's interpreter."""
import importlib.util
import os

import pytest
import torch

INTERPRET = (os.environ.get("TRITONGEN_TEST_TRITON_INTERPRET") == "1" or os.environ.get("TRITON_INTERPRET") == "1"
             ) and importlib.util.find_spec("triton") is not None
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"
if not (torch.cuda.is_available() or INTERPRET):
    pytest.skip("needs CUDA (or TRITONGEN_TEST_TRITON_INTERPRET=1)", allow_module_level=True)
pytest.importorskip("triton")

from tritongen.ops import reference  # noqa: E402

DEVICE = "cpu" if INTERPRET else "cuda"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 4, 2, 32), (1, 32, 8, 128), (5, 6, 6, 80)])  # T, q heads, k heads, D
@pytest.mark.parametrize("offset", [0.0, 1.0])  # Qwen3's form, Gemma 3's
def test_qk_norm_matches_reference_per_head(dtype, shape, offset):
    from tritongen.ops.triton_qk_norm import qk_rms_norm_

    if INTERPRET and dtype is torch.bfloat16:
        pytest.skip("the interpreter computes bf16 through numpy float32; covered on CUDA")
    T, hq, hk, d = shape
    g = torch.Generator().manual_seed(2)
    qkv = (3 * torch.randn(T, (hq + 2 * hk) * d, generator=g)).to(DEVICE, dtype)
    wq = (1 + 0.1 * torch.randn(d, generator=g)).to(DEVICE, dtype)
    wk = (1 + 0.1 * torch.randn(d, generator=g)).to(DEVICE, dtype)
    q, k, v = qkv.split((hq * d, hk * d, hk * d), dim=-1)
    want_q = reference.rms_norm(q.reshape(T, hq, d), wq, 1e-6, offset).reshape(T, -1)
    want_k = reference.rms_norm(k.reshape(T, hk, d), wk, 1e-6, offset).reshape(T, -1)
    want_v = v.clone()
    qk_rms_norm_(qkv, wq, wk, hq, hk, d, 1e-6, offset)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype is torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(q, want_q, **tol)
    torch.testing.assert_close(k, want_k, **tol)
    assert torch.equal(v, want_v)  # the v columns are not touched


def test_qwen3_attention_fused_projection_equals_unfused():
    """fuse_projections + the in-place qk-norm give the separate projections' and norms' q, k, v."""
    from tritongen.models.arch import ModelArch
    from tritongen.models.llama import LlamaAttention, _stack
    from tritongen.models.presets import PRESETS
    from tritongen.ops import kernels

    arch = ModelArch.from_hf_config(PRESETS["tiny-qwen3"])
    torch.manual_seed(0)
    attn = LlamaAttention(arch, 0).to(DEVICE)
    with torch.no_grad():
        attn.q_norm.weight.normal_(1.0, 0.1)
        attn.k_norm.weight.normal_(1.0, 0.1)
    x = torch.randn(4, arch.hidden_size, device=DEVICE)
    want = [t.clone() for t in attn._qkv(x)]
    attn.qkv_proj = _stack(attn.q_proj, attn.k_proj, attn.v_proj)
    with kernels.active(kernels.KernelChoices(triton=True)):
        got = attn._qkv(x)
    for g_, w_ in zip(got, want):
        torch.testing.assert_close(g_.reshape(w_.shape), w_, atol=1e-5, rtol=1e-5)
