"""A lower-latency form of ops/triton_allreduce's all-reduce + residual add + RMSNorm for small
batches (TP only, CUDA, symmetric memory; parallel.calibrate picks at load the batch sizes it serves).

The flag handshake costs two NVLink trips per call: a rank signals, and only once the peer's flag is
seen does it load the peer's row. Here each rank instead stores its row straight into a slot of
every peer's inbox, and the reader polls the data itself: an inbox starts filled with a sentinel
(negative zero's bits), and a row has arrived when none of its elements holds the sentinel any more
(each element is written once, whole, so an element is either the sentinel or the value). No flag,
no fence: one trip. A row of real data never holds the sentinel, because the writer turns negative
zeros into positive ones first (the same on every rank, so the ranks' sums stay alike; -0 and +0
only differ when every term is zero).

Reuse without a barrier: inboxes rotate over three generations per program slot (the slot's own
call counter modulo 3). At call e a program reads generation e % 3 and resets generation
(e + 2) % 3, the one it read at call e - 1, to the sentinel (right after its push, while the peers'
rows travel). No peer writes that generation before call e + 2, and a peer cannot start call e + 2
before this rank pushed its rows of call e + 1, which it does only after this kernel finished
(stream order). As in the flag version, every rank must make the same sequence of calls with the
same grid, and a poll that waits longer than timeout_ns traps.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritongen.ops.triton_allreduce import _add_norm_row, _count_spin, _outputs, _row_ptr, _timeout_ns

GENERATIONS = 3


@triton.jit
def _sentinel(v, BITS: tl.constexpr):
    """Per element: does v (a 16- or 32-bit float tensor) hold negative zero's bits?"""
    if BITS == 16:
        return v.to(tl.int16, bitcast=True) == -32768
    else:
        return v.to(tl.int32, bitcast=True) == -2147483648


@triton.jit
def _store_sentinel(ptrs, ok, BITS: tl.constexpr, BLOCK: tl.constexpr):
    if BITS == 16:
        tl.store(ptrs.to(tl.pointer_type(tl.int16)), tl.full([BLOCK], -32768, tl.int16), mask=ok)
    else:
        tl.store(ptrs.to(tl.pointer_type(tl.int32)), tl.full([BLOCK], -2147483648, tl.int32), mask=ok)


@triton.jit
def _poll(ptrs, ok, timeout_ns, BITS: tl.constexpr, TIMEOUT: tl.constexpr):
    """The row at `ptrs` once no element holds the sentinel (volatile loads: relaxed, system scope)."""
    v = tl.load(ptrs, mask=ok, other=0.0, volatile=True)
    spins = 0
    start = timeout_ns.to(tl.int64) * 0
    while tl.sum((_sentinel(v, BITS) & ok).to(tl.int32), 0) > 0:
        if TIMEOUT:
            spins, start = _count_spin(spins, start, timeout_ns)
        v = tl.load(ptrs, mask=ok, other=0.0, volatile=True)
    return v


@triton.jit
def _lamport_kernel(BUF_PTRS, EPOCH, R, W, Y, S, offset, inbox, rows_cap, stride_r, N, eps, timeout_ns,
                    RANK: tl.constexpr, WORLD: tl.constexpr, WORLD_POW2: tl.constexpr, BITS: tl.constexpr,
                    TIMEOUT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)  # one program per row (rows <= rows_cap)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    ty = S.dtype.element_ty
    epoch = tl.load(EPOCH + row)
    tl.store(EPOCH + row, epoch + 1)
    gen = epoch % 3
    ranks = tl.arange(0, WORLD_POW2)
    bases = tl.load(BUF_PTRS + ranks, mask=ranks < WORLD, other=0)
    own_base = tl.load(BUF_PTRS + RANK)
    own = tl.load(_row_ptr(own_base, offset, row, N, ty) + cols, mask=ok, other=0.0)
    own = tl.where(_sentinel(own, BITS), tl.zeros_like(own), own)  # -0 -> +0: never the sentinel
    for p in tl.static_range(WORLD):  # this rank's row into slot RANK of generation gen of every peer
        if p != RANK:
            peer_base = tl.sum(tl.where(ranks == p, bases, 0))
            tl.store(_row_ptr(peer_base, inbox, (gen * WORLD + RANK) * rows_cap + row, N, ty) + cols, own, mask=ok)
    # The generation read at the previous call back to the sentinel, while the peers' rows travel: no
    # peer writes it before the call after next (module docstring).
    old = (gen + 2) % 3
    for p in tl.static_range(WORLD):
        if p != RANK:
            _store_sentinel(_row_ptr(own_base, inbox, (old * WORLD + p) * rows_cap + row, N, ty) + cols, ok, BITS,
                            BLOCK)
    r = tl.load(R + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    x = tl.zeros([BLOCK], dtype=tl.float32)
    for p in tl.static_range(WORLD):  # in rank order on every rank: the same bits everywhere
        if p == RANK:
            x += own.to(tl.float32)
        else:
            x += _poll(_row_ptr(own_base, inbox, (gen * WORLD + p) * rows_cap + row, N, ty) + cols, ok, timeout_ns,
                       BITS, TIMEOUT).to(tl.float32)
    _add_norm_row(x, r, w, row, N, eps, Y, S, cols, ok)


def inbox_elements(world: int, rows_cap: int, hidden: int) -> int:
    """Elements of one rank's inboxes: GENERATIONS x world slots x rows_cap rows x hidden."""
    return GENERATIONS * world * rows_cap * hidden


def fill_sentinel(inbox: torch.Tensor) -> None:
    """Every element of `inbox` (a float16/bfloat16/float32 tensor) set to negative zero's bits."""
    bits = {2: (torch.int16, -32768), 4: (torch.int32, -2147483648)}[inbox.element_size()]
    inbox.view(bits[0]).fill_(bits[1])


def lamport_add_rms_norm(buf_ptrs: torch.Tensor, epoch: torch.Tensor, offset: int, inbox: int, rows_cap: int,
                         rows: int, residual: torch.Tensor, weight: torch.Tensor, eps: float, rank: int,
                         timeout_s: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(Σ_ranks partial + residual), Σ_ranks partial + residual) for rows <= rows_cap rows, as
    triton_allreduce.allreduce_add_rms_norm. buf_ptrs: int64 [world] addresses of every rank's
    symmetric buffer; offset: elements from it to row 0 of this rank's partial sums; inbox: elements
    from it to the inboxes (inbox_elements of them, filled with fill_sentinel before the first call,
    on every rank); epoch: this rank's int32 [>= rows_cap] per-slot call counters, zeroed at the start."""
    world = buf_ptrs.numel()
    if not 1 <= rows <= rows_cap or epoch.numel() < rows_cap:
        raise ValueError(f"lamport_add_rms_norm takes 1..{rows_cap} rows, got {rows}")
    r2, y, s = _outputs(residual, offset)
    n = r2.shape[1]
    if (inbox * residual.element_size()) % 16:
        raise ValueError(f"lamport_add_rms_norm needs a 16-byte aligned inbox (offset {inbox})")
    timeout_ns, check = _timeout_ns(timeout_s)
    _lamport_kernel[(rows,)](
        buf_ptrs, epoch, r2, weight, y, s, offset, inbox, rows_cap, r2.stride(0), n, eps, timeout_ns, RANK=rank,
        WORLD=world, WORLD_POW2=triton.next_power_of_2(world), BITS=8 * residual.element_size(), TIMEOUT=check,
        BLOCK=triton.next_power_of_2(n), num_warps=8)
    return y.view(residual.shape), s.view(residual.shape)
