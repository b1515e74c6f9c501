"""The per-token FP8 quantization kernel (ops/triton_fp8_quant.py) against the reference
(ops.fp8.quantize_tokens): scale equal, q equal bit for bit, for one-block and looped rows,
all-zero rows (the MIN_SCALE clamp) and values clamped to ±448. Runs on CUDA, else in Triton's
interpreter (tests/conftest.py sets TRITON_INTERPRET=1 without CUDA). The interpreter's emulated
float32 -> e4m3 conversion mis-rounds values whose rounding carries into the next power of two
(124.9 -> 64, not 128; tests/gpu/test_fp8_kv_cache.py) and some e4m3 subnormals, so there q is
compared with the reference's clamped float32 values put through that same conversion (every
element: the kernel computes the reference's float32 values exactly); on CUDA with the
reference's q itself.
"""
import importlib.util
import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
if not (torch.cuda.is_available() or INTERPRET):
    pytest.skip("needs CUDA (or Triton's interpreter)", allow_module_level=True)
if not INTERPRET and torch.cuda.get_device_capability() < (8, 9):
    pytest.skip("fp8 e4m3 conversion needs compute capability 8.9+", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tritongen.ops.fp8 import E4M3, E4M3_MAX, quantize_tokens as quantize_ref  # noqa: E402
from tritongen.ops.fp8_scales import MIN_SCALE  # noqa: E402
from tritongen.ops.triton_fp8_quant import quantize_tokens  # noqa: E402

DEVICE = "cpu" if INTERPRET else "cuda"


@triton.jit
def _to_e4m3(X, Q, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Q + i, tl.load(X + i, mask=i < N).to(Q.dtype.element_ty), mask=i < N)


def _want_q(x: torch.Tensor, want_q: torch.Tensor, want_s: torch.Tensor) -> torch.Tensor:
    """The reference's q as this device converts float32 to e4m3 (the reference's own on CUDA)."""
    if not INTERPRET:
        return want_q
    exact = (x.float() / want_s).clamp(-E4M3_MAX, E4M3_MAX).contiguous()
    q = torch.empty_like(exact, dtype=E4M3)
    _to_e4m3[(triton.cdiv(exact.numel(), 4096),)](exact, q, exact.numel(), BLOCK=4096)
    return q


def _check(x: torch.Tensor) -> None:
    q, s = quantize_tokens(x)
    want_q, want_s = quantize_ref(x)
    assert q.dtype == E4M3 and q.shape == x.shape and s.dtype == torch.float32 and s.shape == (x.shape[0], 1)
    assert torch.equal(s, want_s)
    assert torch.equal(q.float(), _want_q(x, want_q, want_s).float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 7, 300])
@pytest.mark.parametrize("k", [64, 1000, 4096, 11008])
def test_kernel_equals_the_reference(dtype, rows, k):
    torch.manual_seed(rows * k)
    x = (torch.randn(rows, k, device=DEVICE) * torch.logspace(-3, 2, rows, device=DEVICE)[:, None]).to(dtype)
    _check(x)


@pytest.mark.parametrize("k", [64, 11008, 20000])  # 20000: past ONE_BLOCK_MAX, read in two passes
def test_all_zero_rows_get_the_minimum_scale(k):
    x = torch.randn(5, k, device=DEVICE)
    x[1] = 0
    x[4] = 0
    _check(x)
    q, s = quantize_tokens(x)
    assert s[1].item() == s[4].item() == torch.tensor(MIN_SCALE, dtype=torch.float32).item()
    assert not q[1].float().any() and not q[4].float().any()


@pytest.mark.parametrize("k", [1000, 11008, 20000])
def test_large_values_clamp_to_the_e4m3_range(k):
    torch.manual_seed(k)
    x = torch.randn(3, k, device=DEVICE) * 1e30
    x[:, 0] = 3e38  # |x| / scale of the others underflows; the amax element maps to ±448
    x[1, 0] = -3e38
    _check(x)
    q, _ = quantize_tokens(x)
    assert q.float()[:, 0].tolist() == [E4M3_MAX, -E4M3_MAX, E4M3_MAX]


def test_strided_rows_and_empty_batch():
    x = torch.randn(6, 512, device=DEVICE)[::2]  # row stride 1024
    _check(x)
    q, s = quantize_tokens(x[:0])
    assert q.shape == (0, 512) and s.shape == (0, 1)


@pytest.mark.parametrize("add", [False, True], ids=["norm", "add_norm"])
@pytest.mark.parametrize("offset", [0.0, 1.0], ids=["llama", "gemma"])
@pytest.mark.parametrize("rows, n", [(1, 576), (5, 4096)])
def test_rms_norm_hands_its_output_quantized(add, offset, rows, n):
    """The RMSNorm kernels' QUANT epilogue (ops.kernels.rms_norm_fp8 / add_rms_norm_fp8 on CUDA): q
    and scale of quantize_tokens applied to the norm's own output, and, with the add, the same sum."""
    from tritongen.ops import triton_elementwise as te

    dtype = torch.float32 if INTERPRET else torch.bfloat16
    torch.manual_seed(rows + n)
    x, r = (torch.randn(rows, n, device=DEVICE).to(dtype) for _ in range(2))
    w = (1 + 0.1 * torch.randn(n, device=DEVICE)).to(dtype)
    if add:
        (q, s), total = te.add_rms_norm_fp8(x, r, w, 1e-6, offset)
        y, want_total = te.add_rms_norm(x, r, w, 1e-6, offset)
        assert torch.equal(total, want_total)
    else:
        q, s = te.rms_norm_fp8(x, w, 1e-6, offset)
        y = te.rms_norm(x, w, 1e-6, offset)
    want_q, want_s = quantize_ref(y)
    assert q.dtype == E4M3 and q.shape == (rows, n) and s.shape == (rows, 1)
    assert torch.equal(s, want_s)
    assert torch.equal(q.float(), _want_q(y, want_q, want_s).float())


@pytest.mark.parametrize("rows, n", [(1, 1536), (5, 11008)])
def test_silu_mul_hands_its_output_quantized(rows, n):
    """SiLU·mul's fp8 kernel (ops.kernels.silu_and_mul_fp8 on CUDA): q and scale of quantize_tokens
    applied to the SiLU·mul kernel's own output."""
    from tritongen.ops import triton_elementwise as te

    dtype = torch.float32 if INTERPRET else torch.bfloat16
    torch.manual_seed(rows + n)
    gate_up = (torch.randn(rows, 2 * n, device=DEVICE) * 3).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)  # strided halves, as the stacked projection's output
    q, s = te.silu_and_mul_fp8(gate, up)
    y = te.silu_and_mul(gate, up)
    want_q, want_s = quantize_ref(y)
    assert q.dtype == E4M3 and q.shape == (rows, n) and s.shape == (rows, 1)
    assert torch.equal(s, want_s)
    assert torch.equal(q.float(), _want_q(y, want_q, want_s).float())
