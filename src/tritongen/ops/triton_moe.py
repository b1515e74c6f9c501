"""Fused MoE on CUDA: a grouped GEMM over the tokens sorted by expert (Triton).

A step's T tokens each pick k experts: P = T*k (token, slot) pairs, pair p = t*k + j. `align`
sorts the pairs by expert and pads every expert's run to a multiple of BLOCK_M, so each BLOCK_M-row
block of the sorted order belongs to one expert (`block_expert`); padding rows hold the id P and
read nothing. Up to ALIGN_KERNEL_MAX_PAIRS pairs (every decode step) that is one Triton program
(_align_kernel) instead of some 28 small torch kernels (align_torch, the larger batches' path).
Two kernels then walk those blocks:
  gate_up  h[p] = silu(x[t] @ W1[e].T) * (x[t] @ W3[e].T)  (both halves of w13 in one program,
           SiLU·mul in the epilogue), h [P, I];
  down     y[p] = topk_weight[p] * (h[p] @ W2[e].T), y [P, H];
and `_sum_slots_kernel` adds each token's k rows in float32, in slot order (deterministic, no
atomics), rounding once to the output dtype: one launch where torch's sum and cast took two.
Every shape is static for a given T (the sort, the padding and the block count are computed on
the device, never read back), so decode steps run inside CUDA graphs. Blocks past the padded
total exit at once. The tile shapes of each (N, K, BLOCK_M) are picked by Triton's autotuner on
first use (before graph capture: the graph builder runs each batch size once eagerly first).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl


def block_m_for(num_pairs: int, num_experts: int) -> int:
    """Rows per block: about the mean pairs per expert (little padding for decode batches), 16..64."""
    per_expert = num_pairs / num_experts
    for bm in (16, 32):
        if per_expert <= bm:
            return bm
    return 64


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """ops.moe.select_experts in one launch (a program per token) instead of five torch kernels:
    softmax in float32 over the row, the top k by repeated arg-max (the lowest expert on a tie),
    renormalized to sum 1 where asked. (weights float32 [T, k], expert ids int64 [T, k])."""
    logits = router_logits.reshape(-1, router_logits.shape[-1])
    tokens, experts = logits.shape
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=logits.device)
    if tokens:
        _select_experts_kernel[(tokens,)](logits, weights, ids, experts, logits.stride(0), TOP_K=top_k,
                                          BLOCK_E=triton.next_power_of_2(experts), RENORMALIZE=renormalize)
    return weights, ids


@triton.jit
def _select_experts_kernel(logits_ptr, weights_ptr, ids_ptr, E, stride_t, TOP_K: tl.constexpr,
                           BLOCK_E: tl.constexpr, RENORMALIZE: tl.constexpr):
    t = tl.program_id(0)
    experts = tl.arange(0, BLOCK_E)
    ok = experts < E
    x = tl.load(logits_ptr + t * stride_t + experts, mask=ok, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    probs = tl.where(ok, e / tl.sum(e, axis=0), -1.0)  # -1: below every probability, never picked
    slots = tl.arange(0, TOP_K)
    top_w = tl.zeros([TOP_K], dtype=tl.float32)
    top_i = tl.zeros([TOP_K], dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(probs, axis=0)
        pick = tl.min(tl.where(probs == best, experts, BLOCK_E), axis=0)  # the lowest expert of a tie
        top_w = tl.where(slots == j, best, top_w)
        top_i = tl.where(slots == j, pick, top_i)
        probs = tl.where(experts == pick, -1.0, probs)
    if RENORMALIZE:
        top_w = top_w / tl.sum(top_w, axis=0)
    tl.store(weights_ptr + t * TOP_K + slots, top_w)
    tl.store(ids_ptr + t * TOP_K + slots, top_i.to(tl.int64))


ALIGN_KERNEL_MAX_PAIRS = 8192
"""Up to this many (token, expert) pairs `align` is one Triton program (_align_kernel): every
decode step, graphs included. Larger (prefill) batches take the torch ops of align_torch."""


def _padded_size(pairs: int, num_experts: int, block_m: int) -> int:
    """The static length of sorted_ids: round_up(P + min(E, P) * (block_m - 1), block_m)."""
    return -(-(pairs + min(num_experts, pairs) * (block_m - 1)) // block_m) * block_m


def align(topk_ids: torch.Tensor, num_experts: int, block_m: int
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted_ids [S], block_expert [S / block_m], num_padded [1]) of the pairs sorted by expert
    (stably: pair order within an expert), each expert's run padded to a multiple of block_m with
    the id P; S is the static bound _padded_size. One kernel up to ALIGN_KERNEL_MAX_PAIRS pairs,
    else align_torch; both give the same tensors."""
    if topk_ids.numel() > ALIGN_KERNEL_MAX_PAIRS:
        return align_torch(topk_ids, num_experts, block_m)
    flat = topk_ids.flatten().contiguous()
    pairs = flat.numel()
    size = _padded_size(pairs, num_experts, block_m)
    sorted_ids = torch.empty(size, dtype=torch.int32, device=flat.device)
    block_expert = torch.empty(size // block_m, dtype=torch.int32, device=flat.device)
    num_padded = torch.empty(1, dtype=torch.int32, device=flat.device)
    block_e = triton.next_power_of_2(num_experts)
    _align_kernel[(1,)](flat, sorted_ids, block_expert, num_padded, pairs, num_experts, size,
                        BLOCK_M=block_m, BLOCK_E=block_e, CHUNK=min(64, max(16, 8192 // block_e)))
    return sorted_ids, block_expert, num_padded


@triton.jit
def _align_kernel(ids_ptr, sorted_ptr, block_expert_ptr, num_padded_ptr, P, E, S,
                  BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr):
    """align in one program, CHUNK pairs at a time: count each expert's pairs, pad the counts to
    BLOCK_M and prefix-sum them (each expert's run in sorted order), fill sorted_ids with P, then
    place pair p at its expert's start + the pairs of that expert before it (an equality matrix
    within the chunk, running counts across chunks), and name each block's expert."""
    experts = tl.arange(0, BLOCK_E)
    lane = tl.arange(0, CHUNK)
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    for p0 in range(0, P, CHUNK):
        ids = tl.load(ids_ptr + p0 + lane, mask=p0 + lane < P, other=-1).to(tl.int32)
        counts += tl.sum((ids[:, None] == experts[None, :]).to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    placed = ends - padded  # where each expert's next pair goes
    for s0 in range(0, S, CHUNK):
        tl.store(sorted_ptr + s0 + lane, tl.zeros([CHUNK], dtype=tl.int32) + P, mask=s0 + lane < S)
    tl.debug_barrier()  # the fill lands before any pair's id (other threads may write the same slot)
    for p0 in range(0, P, CHUNK):
        p = p0 + lane
        ids = tl.load(ids_ptr + p, mask=p < P, other=-1).to(tl.int32)
        onehot = (ids[:, None] == experts[None, :]).to(tl.int32)
        before = tl.sum(((ids[:, None] == ids[None, :]) & (lane[None, :] < lane[:, None])).to(tl.int32), axis=1)
        tl.store(sorted_ptr + tl.sum(onehot * placed[None, :], axis=1) + before, p.to(tl.int32), mask=p < P)
        placed += tl.sum(onehot, axis=0)
    blocks = S // BLOCK_M
    for b0 in range(0, blocks, CHUNK):
        start = (b0 + lane) * BLOCK_M  # the first sorted position of each block: its expert is the
        # number of expert runs that end at or before it (searchsorted right), at most E - 1
        past = tl.sum(((ends[None, :] <= start[:, None]) & (experts[None, :] < E)).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + b0 + lane, tl.minimum(past, E - 1), mask=b0 + lane < blocks)
    tl.store(num_padded_ptr, tl.sum(padded, axis=0))


def align_torch(topk_ids: torch.Tensor, num_experts: int, block_m: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """align in torch ops (some 28 small kernels): the oracle of _align_kernel and the path of
    batches over ALIGN_KERNEL_MAX_PAIRS pairs."""
    flat = topk_ids.flatten()
    pairs = flat.numel()
    device = flat.device
    size = _padded_size(pairs, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    expert_sorted = flat[order]
    first_of_expert = torch.cumsum(counts, 0) - counts  # where each expert's run starts, unpadded
    rank = torch.arange(pairs, device=device) - first_of_expert[expert_sorted]
    position = ends[expert_sorted] - padded[expert_sorted] + rank
    sorted_ids = torch.full((size,), pairs, dtype=torch.int32, device=device)
    sorted_ids[position] = order.to(torch.int32)
    block_start = torch.arange(0, size, block_m, device=device)
    block_expert = torch.searchsorted(ends, block_start, right=True).clamp_(max=num_experts - 1).to(torch.int32)
    return sorted_ids, block_expert, ends[-1:].to(torch.int32)


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, h_ptr, sorted_ids_ptr, block_expert_ptr, num_padded_ptr,
                    num_pairs, N, K, top_k, stride_xm, stride_we, stride_wn, stride_hm,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    pair = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pair < num_pairs
    token = (pair // top_k).to(tl.int64)
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + token[:, None] * stride_xm + offs_k[None, :]
    g_ptrs = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    u_ptrs = g_ptrs + N * stride_wn  # the up rows follow the gate rows
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
        g = tl.load(g_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        u = tl.load(u_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if IEEE:
            acc_g = tl.dot(a, g, acc_g, input_precision="ieee")
            acc_u = tl.dot(a, u, acc_u, input_precision="ieee")
        else:
            acc_g = tl.dot(a, g, acc_g)
            acc_u = tl.dot(a, u, acc_u)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    h_ptrs = h_ptr + pair[:, None].to(tl.int64) * stride_hm + offs_n[None, :]
    tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


@triton.jit
def _down_kernel(h_ptr, w_ptr, y_ptr, weights_ptr, sorted_ids_ptr, block_expert_ptr, num_padded_ptr,
                 num_pairs, N, K, stride_hm, stride_we, stride_wn, stride_ym,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    pair = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pair < num_pairs
    rows = pair.to(tl.int64)
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = h_ptr + rows[:, None] * stride_hm + offs_k[None, :]
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(a, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w, acc)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    scale = tl.load(weights_ptr + rows, mask=valid, other=0.0)
    y = acc * scale[:, None]
    y_ptrs = y_ptr + rows[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


# Tile candidates (BLOCK_N, BLOCK_K, num_warps, num_stages). Decode-sized blocks (<= 32 rows):
# narrow, deep tiles, many programs streaming weights (the shapes triton_gemv measured best for
# skinny GEMMs on the H200); larger blocks: wider tiles that reuse each loaded row of x more.
_SMALL = ((32, 128, 4, 3), (32, 256, 4, 5), (64, 128, 4, 3), (64, 256, 4, 4), (16, 256, 4, 4))
_LARGE = ((64, 64, 4, 4), (128, 64, 4, 3), (128, 64, 8, 3), (64, 128, 4, 3))
_SMEM_BYTES = 220 * 1024  # an H200 SM has 227 KB of shared memory


def _config_key(c: triton.Config) -> tuple:
    return c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_warps, c.num_stages


def _pruner(halves: int):
    """early_config_prune of a kernel that streams `halves` weight tiles per K step: the block
    size's candidates whose pipelined tiles fit in shared memory."""
    def prune(configs, named_args, **kwargs):
        args = {**named_args, **kwargs}
        bm, elt = args["BLOCK_M"], 4 if args["IEEE"] else 2
        group = _SMALL if bm <= 32 else _LARGE
        keep = [c for c in configs if _config_key(c) in group and
                c.num_stages * c.kwargs["BLOCK_K"] * (bm + halves * c.kwargs["BLOCK_N"]) * elt <= _SMEM_BYTES]
        return keep or [min(configs, key=lambda c: c.num_stages * c.kwargs["BLOCK_K"] * c.kwargs["BLOCK_N"])]
    return prune


_CONFIGS = [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=st)
            for n, k, w, st in dict.fromkeys(_SMALL + _LARGE)]
_KEY = ["N", "K", "BLOCK_M", "IEEE"]
_gate_up_tuned = triton.autotune(_CONFIGS, key=_KEY, prune_configs_by={"early_config_prune": _pruner(2)})(
    _gate_up_kernel)
_down_tuned = triton.autotune(_CONFIGS, key=_KEY, prune_configs_by={"early_config_prune": _pruner(1)})(
    _down_kernel)


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, config: Optional[dict] = None) -> torch.Tensor:
    """ops.moe.fused_experts on the Triton kernels. `config` ({"BLOCK_M", "BLOCK_N", "BLOCK_K"},
    optional num_warps / num_stages) fixes the tiles instead of autotuning (tests, the interpreter)."""
    tokens, hidden = x.shape
    num_experts, two_i, _ = w13.shape
    inter = two_i // 2
    top_k = topk_ids.shape[1]
    pairs = tokens * top_k
    x = x.contiguous()
    if pairs == 0:
        return torch.zeros_like(x)
    bm = config["BLOCK_M"] if config else block_m_for(pairs, num_experts)
    sorted_ids, block_expert, num_padded = align(topk_ids, num_experts, bm)
    blocks = block_expert.numel()
    h = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    y = torch.empty(pairs, hidden, dtype=x.dtype, device=x.device)
    weights = topk_weights.to(torch.float32).contiguous().view(-1)
    ieee = x.dtype == torch.float32  # float32 stays float32 (no TF32) for parity runs
    common = dict(BLOCK_M=bm, IEEE=ieee)
    if config:
        common.update({k: v for k, v in config.items() if k != "BLOCK_M"})
    gate_up = _gate_up_kernel if config else _gate_up_tuned
    down = _down_kernel if config else _down_tuned
    gate_up[lambda m: (blocks, triton.cdiv(inter, m["BLOCK_N"]))](
        x, w13, h, sorted_ids, block_expert, num_padded, pairs, inter, hidden, top_k,
        x.stride(0), w13.stride(0), w13.stride(1), h.stride(0), **common)
    down[lambda m: (blocks, triton.cdiv(hidden, m["BLOCK_N"]))](
        h, w2, y, weights, sorted_ids, block_expert, num_padded, pairs, hidden, inter,
        h.stride(0), w2.stride(0), w2.stride(1), y.stride(0), **common)
    return sum_slots(y, top_k)


@triton.jit
def _sum_slots_kernel(y_ptr, out_ptr, H, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    # Grid (tokens, cdiv(H, BLOCK)): out[t, cols] = sum_j y[t * TOP_K + j, cols], j in order.
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < H
    acc = tl.zeros([BLOCK], tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(y_ptr + (t * TOP_K + j) * H + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * H + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


def sum_slots(y: torch.Tensor, top_k: int) -> torch.Tensor:
    """[T, H] in y's dtype: each token's top_k rows of the contiguous y [T * top_k, H] added in
    float32 in slot order, rounded once (torch's y.view(T, k, H).sum(1, dtype=float32).to(dtype),
    in one launch)."""
    pairs, hidden = y.shape
    out = torch.empty(pairs // top_k, hidden, dtype=y.dtype, device=y.device)
    block = min(1024, triton.next_power_of_2(hidden))
    if pairs:
        _sum_slots_kernel[(pairs // top_k, triton.cdiv(hidden, block))](y, out, hidden, TOP_K=top_k, BLOCK=block)
    return out
