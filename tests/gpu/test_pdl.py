"""Programmatic dependent launch (ops/triton_pdl.py) on Hopper: the decode-step kernels launched with
PDL inside a CUDA graph give, replay after replay, the bits they give launched one after the other
(a kernel that read before its wait would see the previous replay's inputs), and an engine with it
gives the CPU reference's greedy tokens."""
import pytest
import torch

if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
    pytest.skip("needs a CUDA device of compute capability 9.0 or later", allow_module_level=True)

from tritongen import LLM, SamplingParams  # noqa: E402
from tritongen.ops import kernels, triton_elementwise as te, triton_fp8, triton_gemv  # noqa: E402
from tritongen.ops.fp8 import Fp8Scales, quantize_weight  # noqa: E402

HIDDEN, INTER, VOCAB = 1024, 2816, 4096


def _layers():
    g = torch.Generator(device="cuda").manual_seed(0)
    scales = Fp8Scales("channel")
    gate_up = quantize_weight(torch.randn(2 * INTER, HIDDEN, device="cuda", generator=g) * 0.05, scales)
    down = quantize_weight(torch.randn(HIDDEN, INTER, device="cuda", generator=g) * 0.05, scales)
    head = (torch.randn(VOCAB, HIDDEN, device="cuda", generator=g) * 0.05).bfloat16()
    norm = torch.rand(HIDDEN, device="cuda", generator=g).bfloat16() + 0.5
    return scales, gate_up, down, head, norm


def _chain(x, residual, layers):
    """An fp8 MLP and a bf16 head as a batch-1 step runs them: the quantizing add + RMSNorm, the
    quantized-token gate/up product (split over K), SiLU·mul, the weight-only down product (split
    8 ways, its last program reducing through the shared counters), RMSNorm, the skinny GEMM."""
    scales, (gu_q, gu_s), (d_q, d_s), head, norm = layers
    (q, qs), s = te.add_rms_norm_fp8(x, residual, norm, 1e-5)
    tokens = {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "SPLIT_K": 2, "QUANT": True}
    h = triton_fp8.fp8_tokens_linear(q, qs, gu_q, gu_s, scales, None, tokens, torch.bfloat16)
    a = te.silu_and_mul(h[:, :INTER], h[:, INTER:])
    y = triton_fp8.fp8_linear(a, d_q, d_s, scales, None, {"BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 4, "SPLIT_K": 8})
    z = te.rms_norm(y + s, norm, 1e-5)
    return triton_gemv.skinny_linear(z, head, block_n=32, block_k=256, split_k=2)


def test_pdl_chain_in_a_graph_gives_the_plain_launches_bits():
    layers = _layers()
    x = torch.zeros(1, HIDDEN, device="cuda", dtype=torch.bfloat16)
    residual = torch.zeros_like(x)
    plain = kernels.KernelChoices(triton=True, pdl=False)
    with kernels.active(kernels.KernelChoices(triton=True, pdl=True)):
        _chain(x, residual, layers)  # compiles and grows the split workspace before capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = _chain(x, residual, layers)
    for i in range(20):
        g = torch.Generator(device="cuda").manual_seed(100 + i)
        x.copy_(torch.randn(x.shape, device="cuda", generator=g))
        residual.copy_(torch.randn(x.shape, device="cuda", generator=g))
        graph.replay()
        with kernels.active(plain):
            want = _chain(x, residual, layers)
        assert torch.equal(out, want), f"replay {i}: PDL output differs from the plain launches'"


def test_engine_with_pdl_gives_the_cpu_reference_tokens():
    torch.backends.cuda.matmul.allow_tf32 = False
    kw = dict(dtype="float32", block_size=16, num_blocks=256)
    gpu = LLM("dummy:tiny-llama", device="cuda", pdl=True, **kw)
    cpu = LLM("dummy:tiny-llama", device="cpu", **kw)
    assert gpu.engine.runner.kernels.pdl
    cpu.engine.runner.model.load_state_dict({k: v.cpu() for k, v in gpu.engine.runner.model.state_dict().items()})
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=0)
    prompts = [[5, 9, 14, 3, 77], list(range(40, 90)), [11] * 7]
    for got, want in zip(gpu.generate(prompts, greedy), cpu.generate(prompts, greedy)):
        assert got.token_ids == want.token_ids
        assert max(abs(a.logprob - b.logprob) for a, b in zip(got.logprobs, want.logprobs)) < 1e-3
