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
every wave of programs (512 rows as 512 programs were slower than two-shot + RMSNorm). In that loop
(two ranks) the loads of a program's next row, the peer's above all, are issued before its current
row is reduced, so that their latency overlaps work instead of adding up row by row
(benchmarks/probes/fused_rows_probe.py times it with the peer simulated).

No end barrier: the row-parallel layers alternate between two halves of the buffer (o_proj writes
half 0, down_proj half 1), so a rank that ran ahead writes the half its peer is not reading; it
cannot get two calls ahead, because the next call waits for the peer's flag. Every rank launches
the same grid for the same call, so the slots' epochs stay in step. Flags compare by signed
difference, so the int32 epochs may wrap.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

SLOTS = 128
"""Flags per rank: the most programs one call runs (about one wave on an H200's 132 SMs)."""
DEFAULT_TIMEOUT_S = 600.0
"""How long a kernel waits for a peer's signal before it fails (ParallelConfig.tp_timeout_s's default)."""
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
"""Decided at import, as triton.jit decides it: the interpreter has no GPU clock to time out on."""


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
    _add_norm_row(x, r, w, row, N, eps, Y, S, cols, ok)


@triton.jit
def _add_norm_row(x, r, w, row, N, eps, Y, S, cols, ok):
    """Row `row` of the residual stream S = round(x) + r and of Y = RMSNorm(S) * w (x: the ranks'
    float32 sum, r: the residual row, w: the norm weight, both float32)."""
    x = x.to(S.dtype.element_ty).to(tl.float32)  # the all-reduce's result, rounded once
    s = (x + r).to(S.dtype.element_ty)
    tl.store(S + row * N + cols, s, mask=ok)
    s = s.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(s * s, 0) / N + eps)
    h = (s * rstd).to(Y.dtype.element_ty).to(tl.float32)
    tl.store(Y + row * N + cols, (w * h).to(Y.dtype.element_ty), mask=ok)


@triton.jit
def _two_rank_rows(own_base, peer_base, R, w, Y, S, first, rows, step, offset, stride_r, N, eps, cols, ok):
    """Rows first, first + step, ... < rows of a world of two ranks, after the wait: each row's
    loads for the next one (the peer's partial sums over NVLink above all) are issued before this
    row is summed and normalized, so their latency overlaps its work instead of adding up row after
    row. own + peer in float32 is the same sum on both ranks (two terms commute exactly)."""
    ty = S.dtype.element_ty
    row = first
    ok_row = ok & (row < rows)
    own = tl.load(_row_ptr(own_base, offset, row, N, ty) + cols, mask=ok_row, other=0.0)
    peer = tl.load(_row_ptr(peer_base, offset, row, N, ty) + cols, mask=ok_row, other=0.0, cache_modifier=".cg")
    r = tl.load(R + row * stride_r + cols, mask=ok_row, other=0.0)
    while row < rows:
        nxt = row + step
        more = ok & (nxt < rows)
        n_own = tl.load(_row_ptr(own_base, offset, nxt, N, ty) + cols, mask=more, other=0.0)
        n_peer = tl.load(_row_ptr(peer_base, offset, nxt, N, ty) + cols, mask=more, other=0.0, cache_modifier=".cg")
        n_r = tl.load(R + nxt * stride_r + cols, mask=more, other=0.0)
        _add_norm_row(own.to(tl.float32) + peer.to(tl.float32), r.to(tl.float32), w, row, N, eps, Y, S, cols, ok)
        own, peer, r = n_own, n_peer, n_r
        row = nxt


@triton.jit
def _signal(FLAG_PTRS, EPOCH, slot, RANK: tl.constexpr, WORLD: tl.constexpr, NUM_SLOTS: tl.constexpr):
    """Bump the slot's epoch and store it into every peer's flag for (this rank, slot); returns it."""
    epoch = tl.load(EPOCH + slot) + 1
    tl.store(EPOCH + slot, epoch)
    for p in tl.static_range(WORLD):
        if p != RANK:
            peer_flags = tl.load(FLAG_PTRS + p).to(tl.pointer_type(tl.int32))
            tl.atomic_xchg(peer_flags + RANK * NUM_SLOTS + slot, epoch, sem="release", scope="sys")
    return epoch


@triton.jit
def _globaltimer(dep):
    """The GPU's nanosecond clock (`dep`: any scalar, only to give the value a shape)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dep], dtype=tl.int64, is_pure=False,
                                     pack=1)


@triton.jit
def _trap(dep):
    tl.inline_asm_elementwise("trap;\n\tmov.u32 $0, 0;", "=r,r", [dep], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _count_spin(spins, start, timeout_ns):
    """(spins, start) after one more poll of a spin loop: the clock is read only once the wait is long
    (1024 polls, ~ms; nothing on the fast path), and every 1024 polls after that the kernel traps
    once timeout_ns have passed since (start: int64, 0 before)."""
    spins += 1
    if spins % 1024 == 0:
        if spins == 1024:
            start = _globaltimer(spins)
        elif _globaltimer(spins) - start > timeout_ns:
            _trap(spins)
    return spins, start


@triton.jit
def _wait(FLAG_PTRS, slot, epoch, timeout_ns, RANK: tl.constexpr, WORLD: tl.constexpr, NUM_SLOTS: tl.constexpr,
          TIMEOUT: tl.constexpr):
    """Spin until every peer's flag for (peer, slot) in this rank's flags reached `epoch` (acquire).
    TIMEOUT: after timeout_ns the kernel traps, which fails the stream with a CUDA error that the
    host sees, instead of spinning forever on a peer that died (the interpreter has no clock)."""
    own_flags = tl.load(FLAG_PTRS + RANK).to(tl.pointer_type(tl.int32))
    for p in tl.static_range(WORLD):
        if p != RANK:
            spins = 0
            start = epoch.to(tl.int64) * 0
            while tl.atomic_add(own_flags + p * NUM_SLOTS + slot, 0, sem="acquire", scope="sys") - epoch < 0:
                if TIMEOUT:
                    spins, start = _count_spin(spins, start, timeout_ns)


@triton.jit
def _allreduce_add_rms_norm_kernel(BUF_PTRS, FLAG_PTRS, EPOCH, R, W, Y, S, offset, rows, stride_r, N, eps, timeout_ns,
                                   RANK: tl.constexpr, WORLD: tl.constexpr, WORLD_POW2: tl.constexpr,
                                   NUM_SLOTS: tl.constexpr, ONE_ROW: tl.constexpr, TIMEOUT: tl.constexpr,
                                   BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    epoch = _signal(FLAG_PTRS, EPOCH, pid, RANK, WORLD, NUM_SLOTS)
    # What does not depend on the peers is loaded while the signal travels and the peers catch up,
    # the peers' addresses too (a vector, picked from by rank after the wait).
    ranks = tl.arange(0, WORLD_POW2)
    bases = tl.load(BUF_PTRS + ranks, mask=ranks < WORLD, other=0)
    own_base = tl.load(BUF_PTRS + RANK)
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    if ONE_ROW:
        own = tl.load(_row_ptr(own_base, offset, pid, N, S.dtype.element_ty) + cols, mask=ok, other=0.0)
        r = tl.load(R + pid * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
    _wait(FLAG_PTRS, pid, epoch, timeout_ns, RANK, WORLD, NUM_SLOTS, TIMEOUT)
    if ONE_ROW:
        _sum_add_norm_row(bases, ranks, own, r, w, pid, offset, N, eps, Y, S, cols, ok, RANK, WORLD)
    elif WORLD == 2:
        _two_rank_rows(own_base, tl.sum(tl.where(ranks == 1 - RANK, bases, 0)), R, w, Y, S, pid, rows,
                       tl.num_programs(0), offset, stride_r, N, eps, cols, ok)
    else:
        for row in range(pid, rows, tl.num_programs(0)):
            own = tl.load(_row_ptr(own_base, offset, row, N, S.dtype.element_ty) + cols, mask=ok, other=0.0)
            r = tl.load(R + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
            _sum_add_norm_row(bases, ranks, own, r, w, row, offset, N, eps, Y, S, cols, ok, RANK, WORLD)


def _outputs(residual: torch.Tensor, offset: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(residual as [rows, hidden] with unit column stride, empty y, empty s) after checking that the
    partial-sum rows start 16-byte aligned (the kernels' vector loads)."""
    n = residual.shape[-1]
    if (n * residual.element_size()) % 16 or (offset * residual.element_size()) % 16:
        raise ValueError(f"allreduce_add_rms_norm needs 16-byte aligned rows (hidden {n}, offset {offset})")
    r2 = residual.reshape(-1, n)
    if r2.stride(-1) != 1:
        r2 = r2.contiguous()
    y = torch.empty(r2.shape, dtype=residual.dtype, device=residual.device)
    return r2, y, torch.empty_like(y)


def _timeout_ns(timeout_s: float) -> tuple[int, bool]:
    """(timeout in ns, whether the kernel checks it): not in Triton's interpreter (no GPU clock)."""
    return int(timeout_s * 1e9), not _INTERPRETED and timeout_s > 0


def allreduce_add_rms_norm(buf_ptrs: torch.Tensor, flag_ptrs: torch.Tensor, epoch: torch.Tensor, offset: int,
                           rows: int, residual: torch.Tensor, weight: torch.Tensor, eps: float, rank: int,
                           timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(Σ_ranks partial + residual), Σ_ranks partial + residual) for `rows` rows.

    buf_ptrs / flag_ptrs: int64 [world] addresses of every rank's symmetric buffer / int32 flags
    ([world, slots] each); epoch: this rank's int32 [slots] counters (slots: at most that many
    programs run); offset: elements from the buffer start to row 0 of the partial sums ([rows,
    hidden], contiguous). Every rank must make the same sequence of calls. A peer that has not
    signalled after timeout_s (0: wait forever) fails the kernel with a CUDA error (a dead rank must
    not hang this one)."""
    world, slots = buf_ptrs.numel(), epoch.numel()
    if rows < 1:
        raise ValueError(f"allreduce_add_rms_norm takes at least one row, got {rows}")
    r2, y, s = _outputs(residual, offset)
    n = r2.shape[1]
    timeout_ns, check = _timeout_ns(timeout_s)
    _allreduce_add_rms_norm_kernel[(min(rows, slots),)](
        buf_ptrs, flag_ptrs, epoch, r2, weight, y, s, offset, rows, r2.stride(0), n, eps, timeout_ns, RANK=rank,
        WORLD=world, WORLD_POW2=triton.next_power_of_2(world), NUM_SLOTS=slots, ONE_ROW=rows <= slots,
        TIMEOUT=check, BLOCK=triton.next_power_of_2(n), num_warps=8)
    return y.view(residual.shape), s.view(residual.shape)
