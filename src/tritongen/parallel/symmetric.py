"""The row-parallel all-reduce of decode-sized batches through PyTorch symmetric memory (CUDA).

NCCL's ring all-reduce of a [rows, hidden] bf16 partial sum costs 8.7 µs at 1 row and 30 / 38 µs at
256 / 512 rows on two NVLink-linked H200s; PyTorch's two-shot symmetric-memory all-reduce (each rank
reduces its half with NVLink loads from the peer's buffer, then writes it to every peer) costs
7.7 / 16.8 / 25.3 µs, copy in included (benchmarks/probes/allreduce_probe.py). A copy in and out
would eat that saving, so the row-parallel GEMM writes its partial sum straight into the symmetric
buffer:
- up to `fused_rows` rows (with the Triton kernels on; ParallelConfig.fused_all_reduce_rows,
  DEFAULT_FUSED_ROWS when unset), the layer returns the partial sums unreduced, and the RMSNorm
  after it (tensor_parallel.ReducingRMSNorm) sums the ranks' rows, adds the residual and normalizes
  in one kernel (ops/triton_allreduce.py). o_proj and down_proj write separate halves of a region
  of their own, which is what lets that kernel skip an end barrier;
- up to MAX_BYTES, torch's two-shot kernel reduces in place and the layer's output is a view of the
  buffer, valid until the next row-parallel layer writes it (the residual add right after each
  o_proj / down_proj consumes it first, also inside CUDA graphs, which replay the same order);
- larger inputs (prefill chunks) keep NCCL, which is at least as fast there.
Small batches may reduce with ops/triton_lamport.py instead (each rank stores its rows into the
peers' inboxes and polls its own for theirs: one NVLink trip instead of the flag handshake's two).
parallel.calibrate times both kernels at load and picks the batch sizes where the Lamport one wins;
ParallelConfig.lamport_all_reduce=True uses it up to SLOTS rows without measuring, False never.
ParallelConfig.disable_custom_all_reduce turns all of it off (NCCL everywhere, tensor_parallel.Shard),
fused_all_reduce_rows=0 the fusion only.

The fused kernel reaches the peers through addresses: `handle.buffer_ptrs` are the bases of the
symmetric blocks, and a tensor may sit at an offset inside its block (`peer_addresses`). The flags
share one allocation with the partial sums (`_fused_region`): flags in a small symmetric tensor of
their own faulted at the first atomic store to the peer's copy.

Only the first tensor-parallel engine of a process uses it, which is why `_used_in_this_process` is
process state and not the engine's: torch keeps per-process symmetric-memory state past
destroy_process_group, and the rendezvous of a second engine hung on the 2×H200 (a fresh group name
did not help), so later engines agree with their workers to keep NCCL. Servers run one engine per
process; tests and benchmarks that start several get NCCL from the second on.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from tritongen.config import ParallelConfig
from tritongen.parallel.calibrate import calibrate_lamport

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = ParallelConfig.tp_timeout_s
MAX_BYTES = 16 << 20
"""Inputs up to this size go through the symmetric buffer; larger ones through NCCL."""
DEFAULT_FUSED_ROWS = 512
"""Batches up to this many rows reduce inside the following RMSNorm's kernel, unless
`create(fused_rows=...)` says otherwise (0: off). On the 2×H200 the fused kernel beat two-shot + the
add/RMSNorm kernel at every size up to 512 rows (6.7 vs 9.8 µs at 1 row, 14.6 vs 19.9 at 256, 24.3
vs 30.5 at 512; docs/benchmarks-history.md)."""
_used_in_this_process = False


def wanted(device: torch.device, world_size: int) -> bool:
    return world_size > 1 and device.type == "cuda"


@dataclass
class Peers:
    """What the fused kernel needs to reach the other ranks: int64 [world] addresses of every rank's
    buffer and flags ([world, slots] int32, zeroed), this rank's int32 epoch per slot (kernel program)."""

    rank: int
    buf_ptrs: torch.Tensor
    flag_ptrs: torch.Tensor
    epoch: torch.Tensor
    inbox: int = -1
    """Elements from the buffer start to the Lamport inboxes (ops/triton_lamport.py); -1: none."""
    lamport_epoch: Optional[torch.Tensor] = None
    """int32 [SLOTS]: this rank's call counter per program slot of the Lamport kernel."""
    lamport_rows: int = 0
    """Batches of up to this many rows reduce with the Lamport kernel (0: none)."""


def peer_addresses(handle, t: torch.Tensor) -> torch.Tensor:
    """int64 [world] device addresses of `t` in every rank's mapping, from its rendezvous handle.

    `handle.buffer_ptrs` are the bases of the symmetric *blocks*; a symmetric tensor may sit at an
    offset inside its block (torch sub-allocates), the same offset on every rank. That offset is
    taken from this rank's own pair (tensor address - own block base), so it holds whatever torch
    calls it; the peer mappings must then hold the whole tensor."""
    bases = list(handle.buffer_ptrs)
    offset = t.data_ptr() - bases[handle.rank]
    nbytes = t.numel() * t.element_size()
    if not 0 <= offset <= handle.buffer_size - nbytes:
        raise RuntimeError(f"symmetric tensor at {t.data_ptr():#x} ({nbytes} bytes) is not inside its block "
                           f"at {bases[handle.rank]:#x} ({handle.buffer_size} bytes)")
    logger.debug("symmetric tensor %s: offset %d in blocks at %s", tuple(t.shape), offset, [hex(b) for b in bases])
    return torch.tensor([b + offset for b in bases], dtype=torch.int64, device=t.device)


def _fused_region(dtype: torch.dtype, device: torch.device, rows: int, hidden: int, group_name: str,
                  lamport: bool = False) -> tuple[torch.Tensor, Peers]:
    """The fused path's symmetric region ([2 halves, rows, hidden] partial sums), with `lamport` the
    Lamport kernel's inboxes (filled with its sentinel), and its zeroed flags ([world, SLOTS] int32,
    one per program of the kernel) in one allocation and one rendezvous; collective.

    One allocation because a flags tensor of its own (a few hundred bytes, rendezvoused apart) faulted
    on the 2×H200 at the first atomic store into the peer's copy, while peer loads from the large
    region worked (a variant probe, docs/benchmarks.md)."""
    import torch.distributed._symmetric_memory as symm_mem

    from tritongen.ops.triton_allreduce import SLOTS
    from tritongen.ops.triton_lamport import fill_sentinel, inbox_elements

    world, elt = dist.get_world_size(), torch.empty((), dtype=dtype).element_size()
    data = 2 * rows * hidden
    inbox = inbox_elements(world, SLOTS, hidden) if lamport else 0
    region = symm_mem.empty(data + inbox + -(-world * SLOTS * 4 // elt), dtype=dtype, device=device)
    handle = symm_mem.rendezvous(region, group_name)
    flags = region[data + inbox:].view(torch.int32)[:world * SLOTS]
    flags.zero_()
    if lamport:
        fill_sentinel(region[data:data + inbox])
    torch.cuda.synchronize(device)
    dist.barrier(device_ids=[device.index])  # no peer signals (or pushes) before every rank is ready
    base = peer_addresses(handle, region)
    zeros = lambda n: torch.zeros(n, dtype=torch.int32, device=device)  # noqa: E731
    peers = Peers(dist.get_rank(), base, base + (data + inbox) * elt, zeros(SLOTS),
                  data if lamport else -1, zeros(SLOTS) if lamport else None)
    return region[:data].view(2, rows, hidden), peers


def _measured_lamport_rows(fused: torch.Tensor, peers: Peers, timeout_s: float) -> int:
    """calibrate_lamport's choice; 0 (the flag kernel for every batch) where the measurement itself
    fails. Its code runs alike on every rank, so a Python error stops every rank at the same point."""
    try:
        return calibrate_lamport(fused, peers, timeout_s)
    except Exception as exc:  # noqa: BLE001 - an optimization: keep the proven kernel, say why
        logger.warning("Lamport all-reduce not measured (%s: %s); the flag kernel serves every batch",
                       type(exc).__name__, exc)
        return 0


class SymmetricAllReduce:
    """Symmetric buffers per rank: MAX_BYTES for `output` / `all_reduce_` (two-shot, in place) and,
    for the fused path, `fused` [2 halves, max rows, hidden] for `partial`."""

    def __init__(self, buf: torch.Tensor, group_name: str, fused: Optional[torch.Tensor] = None,
                 peers: Optional[Peers] = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.buf, self.group_name, self.fused, self.peers = buf, group_name, fused, peers
        self.hidden = fused.shape[-1] if fused is not None else 0
        self.timeout_s = timeout_s
        """A dead peer fails the fused kernels after this, as NCCL's watchdog fails a collective."""
        self._pending: Optional[tuple[int, int]] = None
        """(data_ptr, half) of partial sums handed out by `partial` and not reduced yet."""

    @classmethod
    def create(cls, dtype: torch.dtype, device: torch.device, hidden: int = 0, fused_rows: Optional[int] = None,
               lamport: Optional[bool] = None, timeout_s: float = DEFAULT_TIMEOUT_S
               ) -> Optional["SymmetricAllReduce"]:
        """Collective over all ranks of the default group; None (NCCL stays) where torch lacks the
        ops or the rendezvous fails: the path is an optimization, never a requirement. `hidden` 0:
        no fused path; `fused_rows` None: DEFAULT_FUSED_ROWS; `lamport` None: measured at load
        (ParallelConfig's fields of the same meaning)."""
        if not hasattr(torch.ops, "symm_mem") or not hasattr(torch.ops.symm_mem, "two_shot_all_reduce_"):
            logger.info("symmetric-memory all-reduce: not in this torch; NCCL for all all-reduces")
            return None
        global _used_in_this_process
        used = torch.tensor([int(_used_in_this_process)], device=device)
        dist.all_reduce(used, op=dist.ReduceOp.MAX)  # every rank decides alike, or a rendezvous waits forever
        if used.item():
            logger.info("symmetric-memory all-reduce: a tensor-parallel engine of this process used it "
                        "already; NCCL for all all-reduces")
            return None
        _used_in_this_process = True
        try:
            import torch.distributed._symmetric_memory as symm_mem

            group_name = dist.group.WORLD.group_name
            elt = torch.empty((), dtype=dtype).element_size()
            buf = symm_mem.empty(MAX_BYTES // elt, dtype=dtype, device=device)
            symm_mem.rendezvous(buf, group_name)
            if fused_rows is None:
                fused_rows = DEFAULT_FUSED_ROWS
            # hidden * elt % 16: rows 16-byte aligned, for the kernel's vector loads
            if fused_rows <= 0 or hidden * elt % 16:
                hidden = 0
            fused, peers = (_fused_region(dtype, device, fused_rows, hidden, group_name, lamport is not False)
                            if hidden else (None, None))
            if peers is not None and lamport:
                peers.lamport_rows = min(peers.lamport_epoch.numel(), fused_rows)
            elif peers is not None and lamport is None:
                peers.lamport_rows = _measured_lamport_rows(fused, peers, timeout_s)
            logger.info("symmetric-memory all-reduce for up to %d MiB per call, NCCL above%s", MAX_BYTES >> 20,
                        f"; fused with the next RMSNorm up to {fused_rows} rows" if hidden else "")
            return cls(buf, group_name, fused, peers, timeout_s)
        except Exception as exc:  # noqa: BLE001 - fall back to NCCL, say why
            logger.warning("symmetric-memory all-reduce unavailable (%s: %s); NCCL for all all-reduces",
                           type(exc).__name__, exc)
            return None

    def output(self, rows: int, cols: int) -> Optional[torch.Tensor]:
        """A [rows, cols] view of the buffer for a GEMM to write into, or None when it does not fit."""
        n = rows * cols
        return self.buf[:n].view(rows, cols) if 0 < n <= self.buf.numel() else None

    def partial(self, half: int, rows: int, cols: int) -> Optional[torch.Tensor]:
        """[rows, cols] in `half` (0 or 1) of the fused region for a GEMM's partial sums, which the next
        `reduce_add_rms_norm` must consume; None where the fused path does not apply."""
        if not (self.hidden and cols == self.hidden and 0 < rows <= self.fused.shape[1]):
            return None
        if self._pending is not None:
            raise RuntimeError("row-parallel partial sums were never reduced: the layer after a row-parallel "
                               "layer must be a ReducingRMSNorm")
        part = self.fused[half, :rows]
        self._pending = (part.data_ptr(), half)
        return part

    def is_pending(self, x: torch.Tensor) -> bool:
        """Whether `x` holds the partial sums `partial` handed out (and no one else touched them)."""
        if self._pending is None:
            return False
        if x.data_ptr() != self._pending[0]:
            raise RuntimeError("unreduced row-parallel partial sums are pending, but the norm got another tensor")
        return True

    def reduce_add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """(rms_norm(Σ_ranks x + residual), Σ_ranks x + residual) for the pending partial sums `x`."""
        if not self.is_pending(x):
            raise RuntimeError("reduce_add_rms_norm without pending partial sums")
        half = self._pending[1]
        self._pending = None
        return self._reduce_add_rms_norm(x, half, residual, weight, eps)

    def _reduce_add_rms_norm(self, x: torch.Tensor, half: int, residual: torch.Tensor,
                             weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        from tritongen.ops import triton_allreduce

        p = self.peers
        assert p is not None
        offset = half * self.fused.shape[1] * self.hidden
        rows = x.numel() // x.shape[-1]
        if rows <= p.lamport_rows:
            from tritongen.ops.triton_lamport import lamport_add_rms_norm

            return lamport_add_rms_norm(p.buf_ptrs, p.lamport_epoch, offset, p.inbox, p.lamport_epoch.numel(), rows,
                                        residual, weight, eps, p.rank, self.timeout_s)
        return triton_allreduce.allreduce_add_rms_norm(p.buf_ptrs, p.flag_ptrs, p.epoch, offset, rows, residual,
                                                       weight, eps, p.rank, timeout_s=self.timeout_s)

    def all_reduce_(self, out: torch.Tensor) -> torch.Tensor:
        """Sum `out` (a view from `output`) over the ranks, in place."""
        torch.ops.symm_mem.two_shot_all_reduce_(out, "sum", self.group_name)
        return out
