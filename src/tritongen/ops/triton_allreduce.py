"""One kernel for what follows a row-parallel layer: the all-reduce of the partial sums, the
residual add and the RMSNorm (TP only, CUDA, symmetric memory).

Unfused, each o_proj / down_proj of a TP=2 batch-1 step is followed by an all-reduce kernel (7.2 µs
two-shot) and the add + RMSNorm kernel (2.5 µs), 80 times per 13B step. Here every rank's GEMM
wrote its partial rows into its symmetric buffer; each program then
1. bumps its slot's epoch and stores it into every peer's flag for (this rank, slot) (release,
   system scope),
2. waits until each peer's flag for (peer, slot) in its own flags reached the epoch (acquire),
3. for each of its rows, sums the ranks' rows in rank order (the same bits on every rank), rounds
   once as the all-reduce does, and goes on exactly as ops/triton_elementwise's add + RMSNorm kernel.
Up to SLOTS rows there is one program per row, which loads what does not depend on the peers (its
own partial row, the residual, the weight) while the signal travels; larger batches run SLOTS
programs over the rows, so that the handshake is paid once per program rather than once per row in
every wave of programs (512 rows as 512 programs were slower than two-shot + RMSNorm).

No end barrier: the row-parallel layers alternate between two halves of the buffer (o_proj writes
half 0, down_proj half 1), so a rank that ran ahead writes the half its peer is not reading; it
cannot get two calls ahead, because the next call waits for the peer's flag. Every rank launches
the same grid for the same call, so the slots' epochs stay in step. Flags compare by signed
difference, so the int32 epochs may wrap.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

SLOTS = 128
"""Flags per rank: the most programs one call runs (about one wave on an H200's 132 SMs)."""


@triton.jit
def _row_ptr(base, offset, row, N, ty: tl.constexpr):
    """Row `row` of the partial sums at address `base`: rows start 16-byte aligned (the host checks),
    so the loads vectorize."""
    return tl.multiple_of(base.to(tl.pointer_type(ty)) + offset + row * N, 16)


@triton.jit
def _sum_add_norm_row(bases, ranks, own, r, w, row, offset, N, eps, Y, S, cols, ok,
                      RANK: tl.constexpr, WORLD: tl.constexpr):
    x = tl.zeros(cols.shape, dtype=tl.float32)
    for p in tl.static_range(WORLD):  # in rank order on every rank: the same bits everywhere
        if p == RANK:
            x += own.to(tl.float32)
        else:
            part = _row_ptr(tl.sum(tl.where(ranks == p, bases, 0)), offset, row, N, S.dtype.element_ty)
            x += tl.load(part + cols, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
    x = x.to(S.dtype.element_ty).to(tl.float32)  # the all-reduce's result, rounded once
    s = (x + r).to(S.dtype.element_ty)
    tl.store(S + row * N + cols, s, mask=ok)
    s = s.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(s * s, 0) / N + eps)
    h = (s * rstd).to(Y.dtype.element_ty).to(tl.float32)
    tl.store(Y + row * N + cols, (w * h).to(Y.dtype.element_ty), mask=ok)


@triton.jit
def _allreduce_add_rms_norm_kernel(BUF_PTRS, FLAG_PTRS, EPOCH, R, W, Y, S, offset, rows, stride_r, N, eps,
                                   RANK: tl.constexpr, WORLD: tl.constexpr, WORLD_POW2: tl.constexpr,
                                   NUM_SLOTS: tl.constexpr, ONE_ROW: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    epoch = tl.load(EPOCH + pid) + 1
    tl.store(EPOCH + pid, epoch)
    for p in tl.static_range(WORLD):
        if p != RANK:
            peer_flags = tl.load(FLAG_PTRS + p).to(tl.pointer_type(tl.int32))
            tl.atomic_xchg(peer_flags + RANK * NUM_SLOTS + pid, epoch, sem="release", scope="sys")
    # What does not depend on the peers is loaded while the signal travels and the peers catch up,
    # the peers' addresses too (a vector, picked from by rank after the wait).
    ranks = tl.arange(0, WORLD_POW2)
    bases = tl.load(BUF_PTRS + ranks, mask=ranks < WORLD, other=0)
    own_base = tl.load(BUF_PTRS + RANK)
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    if ONE_ROW:
        own = tl.load(_row_ptr(own_base, offset, pid, N, S.dtype.element_ty) + cols, mask=ok, other=0.0)
        r = tl.load(R + pid * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
    own_flags = tl.load(FLAG_PTRS + RANK).to(tl.pointer_type(tl.int32))
    for p in tl.static_range(WORLD):
        if p != RANK:
            while tl.atomic_add(own_flags + p * NUM_SLOTS + pid, 0, sem="acquire", scope="sys") - epoch < 0:
                pass
    if ONE_ROW:
        _sum_add_norm_row(bases, ranks, own, r, w, pid, offset, N, eps, Y, S, cols, ok, RANK, WORLD)
    else:
        for row in range(pid, rows, tl.num_programs(0)):
            own = tl.load(_row_ptr(own_base, offset, row, N, S.dtype.element_ty) + cols, mask=ok, other=0.0)
            r = tl.load(R + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
            _sum_add_norm_row(bases, ranks, own, r, w, row, offset, N, eps, Y, S, cols, ok, RANK, WORLD)


def allreduce_add_rms_norm(buf_ptrs: torch.Tensor, flag_ptrs: torch.Tensor, epoch: torch.Tensor, offset: int,
                           rows: int, residual: torch.Tensor, weight: torch.Tensor, eps: float, rank: int
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(Σ_ranks partial + residual), Σ_ranks partial + residual) for `rows` rows.

    buf_ptrs / flag_ptrs: int64 [world] addresses of every rank's symmetric buffer / int32 flags
    ([world, slots] each); epoch: this rank's int32 [slots] counters (slots: at most that many
    programs run); offset: elements from the buffer start to row 0 of the partial sums ([rows,
    hidden], contiguous). Every rank must make the same sequence of calls."""
    world, slots = buf_ptrs.numel(), epoch.numel()
    n = residual.shape[-1]
    if rows < 1:
        raise ValueError(f"allreduce_add_rms_norm takes at least one row, got {rows}")
    if (n * residual.element_size()) % 16 or (offset * residual.element_size()) % 16:
        raise ValueError(f"allreduce_add_rms_norm needs 16-byte aligned rows (hidden {n}, offset {offset})")
    r2 = residual.reshape(-1, n)
    if r2.stride(-1) != 1:
        r2 = r2.contiguous()
    y = torch.empty(r2.shape, dtype=residual.dtype, device=residual.device)
    s = torch.empty_like(y)
    _allreduce_add_rms_norm_kernel[(min(rows, slots),)](
        buf_ptrs, flag_ptrs, epoch, r2, weight, y, s, offset, rows, r2.stride(0), n, eps, RANK=rank, WORLD=world,
        WORLD_POW2=triton.next_power_of_2(world), NUM_SLOTS=slots, ONE_ROW=rows <= slots,
        BLOCK=triton.next_power_of_2(n), num_warps=8)
    return y.view(residual.shape), s.view(residual.shape)
