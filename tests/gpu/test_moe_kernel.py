"""The fused MoE kernels (ops/triton_moe.py) against the reference (ops/moe.fused_experts_ref).

On CPU they run under the Triton interpreter (TRITON_INTERPRET=1, which tests/conftest.py sets
before any import), at tiny shapes with fixed tiles; on CUDA at tiny and real-ish shapes,
with fixed tiles and with the autotuner, in float32 (IEEE dots) and bfloat16.
"""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

CUDA = torch.cuda.is_available()
# tests/conftest.py sets TRITON_INTERPRET without CUDA when triton is installed (before any import).
INTERPRET = (os.environ.get("TRITONGEN_TEST_TRITON_INTERPRET") == "1" or os.environ.get("TRITON_INTERPRET") == "1"
             ) and importlib.util.find_spec("triton") is not None
if INTERPRET and not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
if not (CUDA or INTERPRET):
    pytest.skip("needs CUDA (or TRITONGEN_TEST_TRITON_INTERPRET=1)", allow_module_level=True)
pytest.importorskip("triton")

from tritongen.ops import moe, triton_moe  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"


def _problem(tokens: int, hidden: int, inter: int, experts: int, top_k: int, dtype, seed: int = 0,
             renormalize: bool = True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * hidden ** -0.5
    w2 = torch.randn(experts, hidden, inter, generator=g) * inter ** -0.5
    logits = torch.randn(tokens, experts, generator=g)
    weights, ids = moe.select_experts(logits, top_k, renormalize)
    to = dict(device=DEVICE)
    return x.to(dtype=dtype, **to), w13.to(dtype=dtype, **to), w2.to(dtype=dtype, **to), weights.to(**to), ids.to(**to)


def _reference(x, w13, w2, weights, ids):
    """The reference in float32 on the CPU (the oracle for every dtype)."""
    f = [t.float().cpu() if t.is_floating_point() else t.cpu() for t in (x, w13, w2, weights)]
    return moe.fused_experts_ref(f[0], f[1], f[2], f[3], ids.cpu())


@pytest.mark.parametrize("tokens, block_m", [(1, 16), (3, 16), (13, 16), (13, 32)])
def test_kernel_matches_reference_fixed_tiles(tokens: int, block_m: int) -> None:
    # I=24 and H=40 are not multiples of the tiles: the masks are exercised.
    x, w13, w2, weights, ids = _problem(tokens, hidden=40, inter=24, experts=5, top_k=2, dtype=torch.float32)
    out = triton_moe.fused_experts(x, w13, w2, weights, ids,
                                   config={"BLOCK_M": block_m, "BLOCK_N": 16, "BLOCK_K": 16})
    torch.testing.assert_close(out.cpu(), _reference(x, w13, w2, weights, ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tokens, experts, top_k, block_m", [
    (1, 8, 2, 16), (3, 5, 2, 4), (1, 128, 8, 16), (16, 128, 8, 16), (37, 60, 4, 32), (150, 8, 2, 64),
    (300, 128, 8, 64)])
def test_align_kernel_equals_the_torch_ops(tokens: int, experts: int, top_k: int, block_m: int) -> None:
    """The one-program alignment (_align_kernel, every decode batch) gives align_torch's tensors:
    the same stable order within each expert, padding, block experts and padded total. Chunks of
    pairs cross (300 x 8 pairs in chunks of 64), experts are left without pairs, E is not a power
    of two; the last case puts every pair on two experts."""
    g = torch.Generator().manual_seed(tokens * 31 + experts)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    cases = [ids, ids % 2] if tokens == 300 else [ids]
    for case in cases:
        case = case.to(DEVICE)
        got = triton_moe.align(case, experts, block_m)
        want = triton_moe.align_torch(case, experts, block_m)
        assert [t.dtype for t in got] == [torch.int32] * 3
        for a, b, name in zip(got, want, ("sorted_ids", "block_expert", "num_padded")):
            assert torch.equal(a.cpu(), b.cpu()), name


@pytest.mark.parametrize("tokens, experts, top_k, renormalize, dtype", [
    (1, 8, 2, True, torch.bfloat16), (5, 128, 8, False, torch.float32), (33, 60, 4, True, torch.float32),
    (16, 128, 8, True, torch.bfloat16)])
def test_routing_kernel_matches_the_torch_routing(tokens, experts, top_k, renormalize, dtype) -> None:
    """The one-launch routing (softmax in float32, top k by repeated arg-max, renormalized where
    asked) picks experts of the probabilities torch.topk picks, largest first, with their weights
    to float32 rounding; E not a power of two is masked. bf16 logits tie (128 experts of 8-bit
    mantissas): between tied experts either is right, so ids are compared by their probability
    and must be distinct, and equal wherever the probability has no tie."""
    g = torch.Generator().manual_seed(tokens * 7 + experts)
    logits = torch.randn(tokens, experts, generator=g).to(dtype=dtype, device=DEVICE)
    weights, ids = triton_moe.select_experts(logits, top_k, renormalize)
    want_w, want_ids = moe.select_experts_ref(logits, top_k, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int64 and ids.shape == (tokens, top_k)
    probs = torch.softmax(logits.float(), dim=-1).cpu()
    ids, want_ids = ids.cpu(), want_ids.cpu()
    assert torch.equal(probs.gather(1, ids), probs.gather(1, want_ids))
    assert all(len(set(row.tolist())) == top_k for row in ids)
    picked = probs.gather(1, want_ids)
    untied = (probs.unsqueeze(1) == picked.unsqueeze(2)).sum(-1) == 1
    assert torch.equal(ids[untied], want_ids[untied])
    torch.testing.assert_close(weights.cpu(), want_w.cpu(), rtol=1e-6, atol=1e-7)
    if renormalize:
        torch.testing.assert_close(weights.sum(-1).cpu(), torch.ones(tokens), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tokens, top_k, hidden", [(1, 8, 2048), (5, 2, 1000), (3, 8, 4096)])
def test_slot_sum_adds_each_tokens_rows_in_order(tokens: int, top_k: int, hidden: int) -> None:
    """Each token's top_k rows added in float32 in slot order and rounded once: bit for bit the
    sequential sum (columns past a 1024 block and a hidden size that is no power of two included)."""
    dtype = torch.float32 if INTERPRET and not CUDA else torch.bfloat16
    g = torch.Generator().manual_seed(tokens * top_k + hidden)
    y = torch.randn(tokens * top_k, hidden, generator=g).to(DEVICE, dtype)
    want = torch.zeros(tokens, hidden, dtype=torch.float32, device=DEVICE)
    for j in range(top_k):
        want += y.view(tokens, top_k, hidden)[:, j].float()
    got = triton_moe.sum_slots(y, top_k)
    assert got.dtype == dtype and torch.equal(got, want.to(dtype))
    assert triton_moe.sum_slots(y[:0], top_k).shape == (0, hidden)


def test_align_over_the_kernel_bound_takes_the_torch_ops(monkeypatch) -> None:
    ids = torch.tensor([[3, 0], [3, 1], [0, 3]], device=DEVICE)
    monkeypatch.setattr(triton_moe, "_align_kernel", None)  # would fail if launched
    monkeypatch.setattr(triton_moe, "ALIGN_KERNEL_MAX_PAIRS", ids.numel() - 1)
    got = triton_moe.align(ids, num_experts=5, block_m=4)
    assert all(torch.equal(a, b) for a, b in zip(got, triton_moe.align_torch(ids, 5, 4)))


def test_align_pads_each_expert_to_whole_blocks() -> None:
    ids = torch.tensor([[3, 0], [3, 1], [0, 3]], device=DEVICE)
    sorted_ids, block_expert, num_padded = triton_moe.align(ids, num_experts=5, block_m=4)
    pairs = ids.numel()
    assert int(num_padded) == 12  # experts 0, 1, 3: one block of 4 each
    rows = sorted_ids.cpu().view(-1, 4)[:3]
    assert block_expert.cpu()[:3].tolist() == [0, 1, 3]
    flat = ids.flatten().cpu()
    for block, expert in zip(rows, (0, 1, 3)):
        real = block[block < pairs]
        assert sorted(real.tolist()) == sorted((flat == expert).nonzero().flatten().tolist())
        assert (block[len(real):] == pairs).all()  # padding after the expert's pairs
    assert sorted_ids.numel() % 4 == 0 and (sorted_ids.cpu()[12:] == pairs).all()


@pytest.mark.skipif(not CUDA, reason="autotuned tiles and real sizes need CUDA")
@pytest.mark.parametrize("tokens", [1, 7, 64, 300])
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 2e-5), (torch.bfloat16, 3e-2)])
def test_kernel_matches_reference_autotuned_cuda(tokens: int, dtype, atol: float) -> None:
    x, w13, w2, weights, ids = _problem(tokens, hidden=512, inter=384, experts=8, top_k=2, dtype=dtype)
    out = triton_moe.fused_experts(x, w13, w2, weights, ids)
    ref = _reference(x, w13, w2, weights, ids)
    # bf16: inputs rounded to 8 bits of mantissa, h rounded once more; outputs are O(1).
    torch.testing.assert_close(out.float().cpu(), ref, atol=atol, rtol=atol)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_kernel_is_captured_in_a_cuda_graph() -> None:
    """Static shapes, no host reads: a graph replays the same result for new routing."""
    x, w13, w2, weights, ids = _problem(4, hidden=256, inter=128, experts=8, top_k=2, dtype=torch.float32)
    moe.fused_experts(x, w13, w2, weights, ids)  # tune and compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe.fused_experts(x, w13, w2, weights, ids)
    _, _, _, new_w, new_ids = _problem(4, hidden=256, inter=128, experts=8, top_k=2, dtype=torch.float32, seed=9)
    weights.copy_(new_w)
    ids.copy_(new_ids)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.cpu(), _reference(x, w13, w2, weights, ids), atol=2e-5, rtol=2e-5)
