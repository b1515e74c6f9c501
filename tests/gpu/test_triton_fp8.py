"""The FP8 weight-only kernel (ops/triton_fp8.py) against the reference (ops.fp8.fp8_linear_ref,
weight-only) for every scale layout, decode and prefill row counts, with and without bias. Runs on
CUDA, else in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 without CUDA)."""
import importlib.util
import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
if not (torch.cuda.is_available() or INTERPRET):
    pytest.skip("needs CUDA (or Triton's interpreter)", allow_module_level=True)

from tritongen.ops.fp8 import Fp8Scales, dequantize_weight, fp8_linear_ref, quantize_weight  # noqa: E402
from tritongen.ops.triton_fp8 import fp8_linear  # noqa: E402

DEVICE = "cpu" if INTERPRET else "cuda"
LAYOUTS = [Fp8Scales("channel"), Fp8Scales("tensor"), Fp8Scales("block", (128, 128)), Fp8Scales("block", (32, 64))]


@pytest.mark.parametrize("scales", LAYOUTS, ids=lambda s: f"{s.kind}{s.block or ''}")
@pytest.mark.parametrize("rows", [1, 5, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_matches_the_weight_only_reference(scales, rows, bias):
    torch.manual_seed(rows)
    dtype = torch.float32 if INTERPRET else torch.bfloat16
    n, k = 96, 256  # a partial N tile of 64 and two K blocks of 128
    w = torch.randn(n, k, device=DEVICE) * torch.linspace(0.01, 1.0, n, device=DEVICE)[:, None]
    q, s = quantize_weight(w, scales)
    x = torch.randn(rows, k, device=DEVICE).to(dtype)
    b = torch.randn(n, device=DEVICE).to(dtype) if bias else None
    got = fp8_linear(x, q, s, scales, b)
    want = fp8_linear_ref(x, q, s, scales, b, dynamic=False)
    assert got.shape == (rows, n) and got.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def test_three_dimensional_input_and_empty_batch():
    q, s = quantize_weight(torch.randn(64, 128, device=DEVICE), Fp8Scales("channel"))
    x = torch.randn(2, 3, 128, device=DEVICE)
    got = fp8_linear(x, q, s, Fp8Scales("channel"))
    torch.testing.assert_close(got, fp8_linear_ref(x, q, s, Fp8Scales("channel"), dynamic=False), rtol=1e-4, atol=1e-4)
    assert fp8_linear(x[:0].reshape(0, 128), q, s, Fp8Scales("channel")).shape == (0, 64)


def test_unsupported_block_sizes_are_refused_by_name():
    q, s = quantize_weight(torch.randn(40, 40, device=DEVICE), Fp8Scales("block", (20, 20)))
    with pytest.raises(ValueError, match=r"block scales of \(20, 20\) are not supported"):
        fp8_linear(torch.randn(1, 40, device=DEVICE), q, s, Fp8Scales("block", (20, 20)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("scales", [Fp8Scales("channel"), Fp8Scales("block", (128, 128))], ids=lambda s: s.kind)
def test_every_candidate_tiling_matches_the_reference(scales, dtype):
    """Every weight-only tiling, with float32 activations and the bf16 ones the GPU runs."""
    from tritongen.ops.triton_fp8 import candidates

    if INTERPRET and dtype == torch.bfloat16:
        pytest.skip("the interpreter's bf16 tl.dot is not the GPU's (the CPU runs float32 activations)")
    torch.manual_seed(3)
    q, s = quantize_weight(torch.randn(80, 1024, device=DEVICE), scales)
    x = torch.randn(3, 1024, device=DEVICE).to(dtype)
    want = fp8_linear_ref(x.float(), q, s, scales, dynamic=False)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-2, atol=2e-2)
    configs = [c for c in candidates(scales) if not c.get("QUANT")]
    assert len(configs) >= 6 and all(128 % c["BLOCK_K"] == 0 for c in configs if scales.kind == "block")
    for cfg in configs:
        got = fp8_linear(x, q, s, scales, config=cfg)
        torch.testing.assert_close(got.float(), want, **tol, msg=lambda m, cfg=cfg: f"{cfg}: {m}")
    assert any(c.get("QUANT") for c in candidates(scales)) == (scales.kind != "block")


SPLIT_LAYOUTS = [Fp8Scales("channel"), Fp8Scales("tensor"), Fp8Scales("block", (128, 128)),
                 Fp8Scales("block", (64, 256))]  # 64 x 256: splits of 128 cover half a scale block


@pytest.mark.parametrize("scales", SPLIT_LAYOUTS, ids=lambda s: f"{s.kind}{s.block or ''}")
@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize("n, k", [(96, 1024), (80, 1000)])  # 1000: no split's end on a BLOCK_K * SPLIT_K edge
def test_split_k_candidates_match_the_weight_only_reference(scales, rows, n, k):
    from tritongen.ops.triton_fp8 import candidates

    torch.manual_seed(rows + k)
    w = torch.randn(n, k, device=DEVICE) * torch.linspace(0.01, 1.0, n, device=DEVICE)[:, None]
    q, s = quantize_weight(w, scales)
    x = torch.randn(rows, k, device=DEVICE)
    b = torch.randn(n, device=DEVICE) if scales.kind == "channel" else None
    want = fp8_linear_ref(x, q, s, scales, b, dynamic=False)
    split = [c for c in candidates(scales, k) if c["SPLIT_K"] > 1 and not c.get("QUANT")]
    assert {c["SPLIT_K"] for c in split} == {2, 4, 8}
    for cfg in split:
        got = fp8_linear(x, q, s, scales, b, config=cfg)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda m, cfg=cfg: f"{cfg}: {m}")


def test_split_k_reduces_in_a_fixed_order_and_leaves_the_counters_at_zero():
    from tritongen.ops import triton_gemv

    torch.manual_seed(0)
    scales = Fp8Scales("block", (128, 128))
    q, s = quantize_weight(torch.randn(200, 1000, device=DEVICE), scales)
    x = torch.randn(40, 1000, device=DEVICE)  # 40 rows: several M tiles, each N tile's counter per M tile
    cfg = {"BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 4, "SPLIT_K": 4}
    first = fp8_linear(x, q, s, scales, config=cfg)
    torch.testing.assert_close(first, fp8_linear_ref(x, q, s, scales, dynamic=False), rtol=1e-4, atol=1e-4)
    assert torch.equal(first, fp8_linear(x, q, s, scales, config=cfg))
    assert not triton_gemv.split_workspace(x.device, 0, 0)[1].any()


def test_candidates_leave_out_splits_with_no_k_to_cover():
    from tritongen.ops.triton_fp8 import CONFIGS, candidates

    assert len(CONFIGS) == 18 and {c["SPLIT_K"] for c in CONFIGS} == {1, 2, 4, 8}
    # K = 256 in 128-deep steps is two steps: 4 or 8 splits would leave splits empty
    assert {c["SPLIT_K"] for c in candidates(Fp8Scales("channel"), 256)} == {1, 2}
    assert {c["SPLIT_K"] for c in candidates(Fp8Scales("channel"), 4096)} == {1, 2, 4, 8}
    assert all(128 % c["BLOCK_K"] == 0 and 128 % c["BLOCK_N"] == 0
               for c in candidates(Fp8Scales("block", (128, 128)), 4096))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="times kernels in CUDA graphs")
def test_select_configs_gives_each_layer_a_tiling_per_row_bucket():
    from tritongen.ops.fp8 import Fp8Linear
    from tritongen.ops.triton_fp8 import ROW_BUCKETS, select_configs

    layers = [Fp8Linear.from_linear(torch.nn.Linear(256, 384, bias=False, device="cuda", dtype=torch.bfloat16))
              for _ in range(2)]
    made = select_configs(layers, torch.bfloat16)
    assert {key[-1] for key in made} == set(ROW_BUCKETS) and {key[3] for key in made} == {None}
    assert all(set(layer.kernel_configs) == set(ROW_BUCKETS) for layer in layers)
    x = torch.randn(5, 256, device="cuda", dtype=torch.bfloat16)
    dynamic = bool(layers[0].kernel_configs[8].get("QUANT"))  # 5 rows: the 8-row bucket's choice
    torch.testing.assert_close(layers[0](x).float(), fp8_linear_ref(x, layers[0].weight, layers[0].weight_scale,
                                                                     layers[0].scales, dynamic=dynamic).float(),
                               rtol=2e-2, atol=2e-2)


def exact_tokens(rows: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """float32 activations whose per-token quantization is exact: each row is e4m3 values (its
    largest magnitude E4M3_MAX) times a power of two, so scale = that power and x / scale = the
    values. Triton's interpreter rounds float32 -> e4m3 wrongly where rounding carries into the
    exponent (tests/gpu/test_triton_fp8_quant.py); exact inputs keep the CPU comparison about the
    GEMM."""
    from tritongen.ops.fp8 import E4M3, E4M3_MAX

    v = (torch.randn(rows, k, generator=generator) * 64).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).float()
    v[:, 0] = E4M3_MAX
    return (v * 2.0 ** torch.randint(-9, -3, (rows, 1), generator=generator).float()).to(DEVICE)


@pytest.mark.parametrize("producer", ["rms_norm", "silu_mul"])
def test_a_fed_layer_is_timed_after_its_producer(producer):
    """select_configs times a layer fed by an RMSNorm or SiLU·mul (Fp8Linear.producer) with that op
    first: its quantizing variant before a quantized-token config, its plain one before the others.
    Either call gives, bit for bit, what the layer computes on the op's plain output with that config
    (the quantizing epilogue is the quantization kernel's)."""
    from tritongen.ops.fp8 import Fp8Linear
    from tritongen.ops.triton_fp8 import _producer_ops, _timed_call, candidates

    dtype = torch.float32 if INTERPRET else torch.bfloat16
    k, n = 256, 64
    layer = Fp8Linear.from_linear(torch.nn.Linear(k, n, bias=False, device=DEVICE, dtype=dtype))
    x = torch.randn(3, k, device=DEVICE, dtype=dtype)
    torch.manual_seed(1)  # the op's own inputs (residual, gate and up) are drawn when the call is made
    fed = _producer_ops(producer, x)[0]()
    assert fed.shape == x.shape and not torch.equal(fed, x)
    configs = candidates(layer.scales, k)
    for cfg in (next(c for c in configs if c.get("QUANT")), next(c for c in configs if not c.get("QUANT"))):
        torch.manual_seed(1)
        got = _timed_call(x, layer.scales, cfg, producer)(layer)
        assert torch.equal(got, fp8_linear(fed, layer.weight, layer.weight_scale, layer.scales, config=cfg)), cfg
    with pytest.raises(ValueError, match="unknown fp8 producer 'gelu'"):
        _producer_ops("gelu", x)


@pytest.mark.parametrize("scales", [Fp8Scales("channel"), Fp8Scales("tensor")], ids=lambda s: s.kind)
@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize("n, k", [(96, 1024), (80, 1000)])
def test_quantized_token_candidates_match_the_dynamic_reference(scales, rows, n, k):
    """x quantized per token as ops.fp8.quantize_tokens does, fp8 x fp8, the row scales and the
    weight's applied after (split-K too), bias last: fp8_linear_ref(dynamic=True)."""
    from tritongen.ops.triton_fp8 import candidates

    g = torch.Generator().manual_seed(rows * 7 + k)
    w = torch.randn(n, k, generator=g).to(DEVICE) * torch.linspace(0.01, 1.0, n, device=DEVICE)[:, None]
    q, s = quantize_weight(w, scales)
    x = exact_tokens(rows, k, g)
    b = torch.randn(n, generator=g).to(DEVICE)
    quant = [c for c in candidates(scales, k) if c.get("QUANT")]
    assert {c["SPLIT_K"] for c in quant} == {1, 2}
    want = fp8_linear_ref(x, q, s, scales, b, dynamic=True)
    # In the interpreter the fp8 x fp8 sums are float32's. Hopper's FP8 tensor cores add the products
    # with about 14 mantissa bits (truncating; Triton leaves sm_90's fp8 dots on that fast accumulation,
    # max_num_imprecise_acc_default), so on CUDA an output may be off by some 2^-14 of the sum of its
    # products' magnitudes per chunk of K; measured up to 7e-5 of that sum at K = 1024. The bound is
    # 2^-11 of it: a product left out or counted twice (about 1/K of the sum each) still exceeds it.
    bound = 1e-4 + 1e-4 * want.abs()
    if not INTERPRET:
        bound += 2.0 ** -11 * (x.abs() @ dequantize_weight(q, s, scales).abs().T)
    for cfg in quant:
        got = fp8_linear(x, q, s, scales, b, config=cfg)
        err = (got - want).abs()
        assert torch.all(err <= bound), f"{cfg}: max |err| {err.max().item():.3g}, worst err/bound {(err / bound).max().item():.3g}"
    if not INTERPRET:  # real rounding on the GPU: random bf16 activations against the same reference
        xr = torch.randn(rows, k, device=DEVICE, dtype=torch.bfloat16)
        got = fp8_linear(xr, q, s, scales, b.bfloat16(), config=quant[0]).float()
        want = fp8_linear_ref(xr, q, s, scales, b.bfloat16(), dynamic=True).float()
        assert ((got - want).norm() / want.norm()).item() < 1e-2


def test_quantized_token_kernel_refuses_what_it_cannot_take():
    from tritongen.ops.triton_fp8 import TOKEN_CONFIGS

    q, s = quantize_weight(torch.randn(64, 128, device=DEVICE), Fp8Scales("channel"))
    with pytest.raises(ValueError, match="at most 16 rows"):
        fp8_linear(torch.randn(17, 128, device=DEVICE), q, s, Fp8Scales("channel"), config=TOKEN_CONFIGS[0])
    qb, sb = quantize_weight(torch.randn(128, 128, device=DEVICE), Fp8Scales("block", (128, 128)))
    with pytest.raises(ValueError, match="per-channel or per-tensor"):
        fp8_linear(torch.randn(2, 128, device=DEVICE), qb, sb, Fp8Scales("block", (128, 128)), config=TOKEN_CONFIGS[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the engine on CUDA")
def test_norm_quantized_inputs_give_what_the_layers_would_quantize(monkeypatch):
    """With every fp8 projection whose producer can quantize (qkv and gate_up after their RMSNorms,
    down_proj after SiLU·mul) on a quantized-token kernel, the producers hand them their input
    quantized (in their own kernel) and the result is bit for bit what the layers get quantizing
    the bf16 output themselves (the epilogue is the quantization kernel's)."""
    from tritongen import LLM, SamplingParams
    from tritongen.models import llama
    from tritongen.ops.fp8 import Fp8Linear
    from tritongen.ops.triton_fp8 import ROW_BUCKETS, TOKEN_CONFIGS

    llm = LLM("dummy:tiny-llama", dtype="bfloat16", device="cuda", quantization="fp8", enforce_eager=True)
    fed = [m for m in llm.engine.runner.model.modules() if isinstance(m, Fp8Linear) and m.producer]
    assert len(fed) == 3 * len(llm.engine.runner.model.model.layers)  # qkv, gate_up and down of every layer
    for layer in fed:
        layer.kernel_configs = {rows: TOKEN_CONFIGS[1] for rows in ROW_BUCKETS}
    handed = []
    real = llama._hands_tokens
    monkeypatch.setattr(llama, "_hands_tokens", lambda *a: handed.append(real(*a)) or handed[-1])
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
    prompts = [[5, 17, 300, 42], [7] * 3]
    fused = llm.generate(prompts, params)
    assert any(handed)  # the decode steps (at most 16 rows) took the fused path
    monkeypatch.setattr(llama, "_hands_tokens", lambda *a: False)
    monkeypatch.setattr(Fp8Linear, "takes_tokens", lambda self, x: False)  # SiLU·mul's side too
    plain = llm.generate(prompts, params)
    for a, b in zip(fused, plain):
        assert a.token_ids == b.token_ids
        assert [lp.logprob for lp in a.logprobs] == [lp.logprob for lp in b.logprobs]


@pytest.mark.skipif(not INTERPRET, reason="the CPU twin of the CUDA test above, in Triton's interpreter")
def test_producer_quantized_inputs_through_the_model_on_the_cpu(monkeypatch):
    """The model's plumbing of producer-quantized inputs (RMSNorm -> qkv and gate_up, SiLU·mul ->
    down, as Fp8Tokens; the quantized-token kernel in the interpreter) gives what each of those
    layers computes quantizing its own input in the reference (fp8_linear_ref(dynamic=True))."""
    from tritongen import LLM, SamplingParams
    from tritongen.ops.fp8 import Fp8Linear
    from tritongen.ops.triton_fp8 import ROW_BUCKETS, TOKEN_CONFIGS

    llm = LLM("dummy:tiny-llama", dtype="float32", device="cpu", quantization="fp8")
    model = llm.engine.runner.model
    model.fuse_projections()  # what the CUDA runner does at load
    fed = [m for m in model.modules() if isinstance(m, Fp8Linear) and m.producer]
    assert len(fed) == 3 * len(model.model.layers)  # qkv, gate_up and down of every layer
    layer0 = model.model.layers[0]
    assert (layer0.self_attn.qkv_proj.producer, layer0.mlp.gate_up_proj.producer,
            layer0.mlp.down_proj.producer) == ("rms_norm", "rms_norm", "silu_mul")
    for layer in fed:
        layer.kernel_configs = {rows: TOKEN_CONFIGS[0] for rows in ROW_BUCKETS}
    handed = []
    monkeypatch.setattr(Fp8Linear, "takes_tokens",
                        lambda self, x: handed.append(bool(self.kernel_configs)) or handed[-1])
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    prompts = [[5, 17, 300, 42], [7, 7, 7]]
    fused = llm.generate(prompts, params)
    assert handed.count(True) >= 3 * len(model.model.layers) * 6  # every step, every fed layer
    monkeypatch.setattr(Fp8Linear, "takes_tokens", lambda self, x: False)
    monkeypatch.setattr(Fp8Linear, "forward", lambda self, x: fp8_linear_ref(
        x, self.weight, self.weight_scale, self.scales, self.bias, dynamic=bool(self.kernel_configs)))
    plain = llm.generate(prompts, params)
    for a, b in zip(fused, plain):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor([lp.logprob for lp in a.logprobs]),
                                   torch.tensor([lp.logprob for lp in b.logprobs]), rtol=1e-4, atol=1e-4)
