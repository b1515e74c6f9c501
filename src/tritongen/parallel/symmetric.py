"""The row-parallel all-reduce of decode-sized batches through PyTorch symmetric memory (CUDA).

NCCL's ring all-reduce of a [rows, hidden] bf16 partial sum costs 8.7 µs at 1 row and 30 / 38 µs at
256 / 512 rows on two NVLink-linked H200s; PyTorch's two-shot symmetric-memory all-reduce (each rank
reduces its half with NVLink loads from the peer's buffer, then writes it to every peer) costs
7.7 / 16.8 / 25.3 µs, copy in included (benchmarks/allreduce_probe.py). The copy in and out is
what made the saving vanish end to end before, so here the row-parallel GEMM writes its partial sum
straight into the symmetric buffer and torch's two-shot kernel reduces in place: the layer's output
*is* a view of the buffer, valid until the next row-parallel layer writes it (the residual add right
after each o_proj / down_proj consumes it first, also inside CUDA graphs, which replay the same
order). Larger inputs (prefill chunks over MAX_BYTES) keep NCCL, which is at least as fast there.
`TRITONGEN_SYMMETRIC_ALLREDUCE=0` turns it off (NCCL everywhere), for comparisons.

A Triton kernel fusing this all-reduce with the residual add and RMSNorm for small batches was
tried (commit c23ec04) and faulted on the H200; see docs/benchmarks.md.

Only the first tensor-parallel engine of a process uses it: the rendezvous of a second one hung on
the 2×H200 (torch keeps per-process symmetric-memory state past destroy_process_group; a fresh group
name did not help), so later engines agree with their workers to keep NCCL. Servers run one engine
per process; tests and benchmarks that start several get NCCL from the second on.
"""
from __future__ import annotations

import logging
import os
from typing import Optional

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

MAX_BYTES = 16 << 20
"""Inputs up to this size go through the symmetric buffer; larger ones through NCCL."""
_used_in_this_process = False


def wanted(device: torch.device, world_size: int) -> bool:
    return (world_size > 1 and device.type == "cuda"
            and os.environ.get("TRITONGEN_SYMMETRIC_ALLREDUCE", "1").lower() not in ("0", "false", "off"))


class SymmetricAllReduce:
    """One symmetric buffer of MAX_BYTES per rank; `output` hands out its leading rows, `all_reduce_`
    sums them over the ranks in place."""

    def __init__(self, buf: torch.Tensor, group_name: str) -> None:
        self.buf, self.group_name = buf, group_name

    @classmethod
    def create(cls, dtype: torch.dtype, device: torch.device) -> Optional["SymmetricAllReduce"]:
        """Collective over all ranks of the default group; None (NCCL stays) where torch lacks the
        ops or the rendezvous fails: the path is an optimization, never a requirement."""
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
            buf = symm_mem.empty(MAX_BYTES // torch.empty((), dtype=dtype).element_size(), dtype=dtype, device=device)
            symm_mem.rendezvous(buf, group_name)
            logger.info("symmetric-memory all-reduce for up to %d MiB per call, NCCL above", MAX_BYTES >> 20)
            return cls(buf, group_name)
        except Exception as exc:  # noqa: BLE001 - fall back to NCCL, say why
            logger.warning("symmetric-memory all-reduce unavailable (%s: %s); NCCL for all all-reduces",
                           type(exc).__name__, exc)
            return None

    def output(self, rows: int, cols: int) -> Optional[torch.Tensor]:
        """A [rows, cols] view of the buffer for a GEMM to write into, or None when it does not fit."""
        n = rows * cols
        return self.buf[:n].view(rows, cols) if 0 < n <= self.buf.numel() else None

    def all_reduce_(self, out: torch.Tensor) -> torch.Tensor:
        """Sum `out` (a view from `output`) over the ranks, in place."""
        torch.ops.symm_mem.two_shot_all_reduce_(out, "sum", self.group_name)
        return out
