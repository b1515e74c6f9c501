"""One kernel for what follows a row-parallel layer at decode sizes: the all-reduce of the partial
sums, the residual add and the RMSNorm (TP only, CUDA, symmetric memory).

Unfused, each o_proj / down_proj of a TP=2 batch-1 step is followed by an all-reduce kernel (7.2 µs
two-shot) and the add + RMSNorm kernel (2.5 µs), 80 times per 13B step. Here every rank's GEMM
wrote its partial rows into its symmetric buffer; one program per row then
1. bumps the row's epoch and stores it into every peer's flag for (this rank, row) (release, system scope),
2. waits until each peer's flag for (peer, row) in its own flags reached the epoch (acquire),
3. sums the ranks' rows in rank order (the same bits on every rank), rounds once as the all-reduce
   does, and goes on exactly as ops/triton_elementwise's add + RMSNorm kernel.

No end barrier: the row-parallel layers alternate between two halves of the buffer (o_proj writes
half 0, down_proj half 1), so a rank that ran ahead writes the half its peer is not reading; it
cannot get two calls ahead, because the next call waits for the peer's flag. Flags compare by
signed difference, so the int32 epochs may wrap.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _allreduce_add_rms_norm_kernel(BUF_PTRS, FLAG_PTRS, EPOCH, R, W, Y, S, offset, stride_r, N, eps,
                                   RANK: tl.constexpr, WORLD: tl.constexpr, MAX_ROWS: tl.constexpr,
                                   BLOCK: tl.constexpr):
    row = tl.program_id(0)
    epoch = tl.load(EPOCH + row) + 1
    tl.store(EPOCH + row, epoch)
    for p in tl.static_range(WORLD):
        if p != RANK:
            peer_flags = tl.load(FLAG_PTRS + p).to(tl.pointer_type(tl.int32))
            tl.atomic_xchg(peer_flags + RANK * MAX_ROWS + row, epoch, sem="release", scope="sys")
    own_flags = tl.load(FLAG_PTRS + RANK).to(tl.pointer_type(tl.int32))
    for p in tl.static_range(WORLD):
        if p != RANK:
            while tl.atomic_add(own_flags + p * MAX_ROWS + row, 0, sem="acquire", scope="sys") - epoch < 0:
                pass
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.zeros([BLOCK], dtype=tl.float32)
    for p in tl.static_range(WORLD):
        part = tl.load(BUF_PTRS + p).to(tl.pointer_type(S.dtype.element_ty)) + offset + row * N
        part = tl.multiple_of(part, 16)  # rows start 16-byte aligned (host checks): vector loads
        x += tl.load(part + cols, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
    x = x.to(S.dtype.element_ty).to(tl.float32)  # the all-reduce's result, rounded once
    r = tl.load(R + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
    s = (x + r).to(S.dtype.element_ty)
    tl.store(S + row * N + cols, s, mask=ok)
    s = s.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(s * s, 0) / N + eps)
    h = (s * rstd).to(Y.dtype.element_ty).to(tl.float32)
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + row * N + cols, (w * h).to(Y.dtype.element_ty), mask=ok)


def allreduce_add_rms_norm(buf_ptrs: torch.Tensor, flag_ptrs: torch.Tensor, epoch: torch.Tensor, offset: int,
                           rows: int, residual: torch.Tensor, weight: torch.Tensor, eps: float, rank: int
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(Σ_ranks partial + residual), Σ_ranks partial + residual) for `rows` rows.

    buf_ptrs / flag_ptrs: int64 [world] addresses of every rank's symmetric buffer / int32 flags
    ([world, max_rows] each); epoch: this rank's int32 [max_rows] counters; offset: elements from
    the buffer start to row 0 of the partial sums ([rows, hidden], contiguous)."""
    world, max_rows = buf_ptrs.numel(), epoch.numel()
    n = residual.shape[-1]
    if not 0 < rows <= max_rows:
        raise ValueError(f"allreduce_add_rms_norm takes 1..{max_rows} rows, got {rows}")
    if (n * residual.element_size()) % 16 or (offset * residual.element_size()) % 16:
        raise ValueError(f"allreduce_add_rms_norm needs 16-byte aligned rows (hidden {n}, offset {offset})")
    r2 = residual.reshape(-1, n)
    if r2.stride(-1) != 1:
        r2 = r2.contiguous()
    y = torch.empty(r2.shape, dtype=residual.dtype, device=residual.device)
    s = torch.empty_like(y)
    _allreduce_add_rms_norm_kernel[(rows,)](buf_ptrs, flag_ptrs, epoch, r2, weight, y, s, offset, r2.stride(0), n,
                                            eps, RANK=rank, WORLD=world, MAX_ROWS=max_rows,
                                            BLOCK=triton.next_power_of_2(n), num_warps=8)
    return y.view(residual.shape), s.view(residual.shape)
