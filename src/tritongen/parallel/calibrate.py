"""Which all-reduce protocol the fused all-reduce + add + RMSNorm uses, decided at load by measuring
both on this machine's GPUs (parallel.symmetric; CUDA, tensor parallelism).

The flag handshake (ops/triton_allreduce.py) costs two trips between the GPUs per call, the Lamport
form (ops/triton_lamport.py) one, but polls and resets its inboxes. Which one is faster depends on
the link and the batch, so every rank times both in CUDA graphs on the same rows and
`lamport_rows` picks the batch sizes that go to the Lamport kernel. Both kernels sum the ranks in
rank order in float32 and round once, so on the same rows they must give the same bits; if they do
not, on any rank, the Lamport kernel is not used.
"""
from __future__ import annotations

import logging
import math
from typing import Callable, Sequence

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

CALIBRATION_ROWS = (1, 16, 64, 128)
"""The batch sizes timed (at most the fused path's rows and the kernels' SLOTS)."""
LAMPORT_MIN_GAIN = 0.97
"""The Lamport kernel takes a batch size only where it needs at most this share of the flag kernel's time."""


def lamport_rows(rows: Sequence[int], flags_us: Sequence[float], lamport_us: Sequence[float], same: bool) -> int:
    """The most rows up to which the Lamport kernel serves (0: none): the batch sizes in `rows`
    (ascending) from the smallest on, as long as it is LAMPORT_MIN_GAIN faster at each; none at all
    if the two kernels' results differed (`same` False)."""
    served = 0
    if not same:
        return served
    for r, f, lam in zip(rows, flags_us, lamport_us):
        if not lam <= LAMPORT_MIN_GAIN * f:
            break
        served = r
    return served


def _rank_min_us(fns: Sequence[Callable[[], object]], device: torch.device, calls: int = 64, reps: int = 5
                 ) -> list[float]:
    """µs per call of each fn, captured in a CUDA graph of `calls` calls, the best of `reps` replays
    started after a barrier; then the minimum over the ranks (collective). A rank that starts its
    replay late finds its peers' data already there, so its time holds the least waiting."""
    graphs = []
    for fn in fns:
        fn()  # compile, and pair with the peers' first call outside the graph
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        graphs.append(graph)
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for graph in graphs:
        graph.replay()
        best = math.inf
        for _ in range(reps):
            torch.cuda.synchronize(device)
            dist.barrier(device_ids=[device.index])
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) * 1000 / calls)
        times.append(best)
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return t.tolist()


@torch.inference_mode()
def calibrate_lamport(fused: torch.Tensor, peers, timeout_s: float, eps: float = 1e-5) -> int:
    """Collective: lamport_rows for this machine, from both kernels run on random partial sums in
    half 0 of `fused` ([2, rows, hidden], the symmetric region's partial sums) with `peers`
    (parallel.symmetric.Peers with inboxes). Every rank makes the same calls in the same order, as
    the kernels require; the counters they advance stay in step across ranks."""
    from tritongen.ops.triton_allreduce import SLOTS, allreduce_add_rms_norm
    from tritongen.ops.triton_lamport import lamport_add_rms_norm

    device, dtype, hidden = fused.device, fused.dtype, fused.shape[-1]
    rows = [r for r in CALIBRATION_ROWS if r <= min(fused.shape[1], SLOTS)]
    if not rows:
        return 0
    gen = torch.Generator().manual_seed(1 + peers.rank)
    fused[0, :rows[-1]] = torch.randn(rows[-1], hidden, generator=gen).to(device, dtype)
    residual = torch.randn(rows[-1], hidden, generator=gen).to(device, dtype)
    weight = torch.randn(hidden, generator=gen).to(device, dtype)
    p = peers

    def flags(n: int):
        return allreduce_add_rms_norm(p.buf_ptrs, p.flag_ptrs, p.epoch, 0, n, residual[:n], weight, eps, p.rank,
                                      timeout_s=timeout_s)

    def lamport(n: int):
        return lamport_add_rms_norm(p.buf_ptrs, p.lamport_epoch, 0, p.inbox, SLOTS, n, residual[:n], weight, eps,
                                    p.rank, timeout_s)

    same = all(all(torch.equal(a, b) for a, b in zip(flags(n), lamport(n))) for n in rows)
    agreed = torch.tensor([int(same)], device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    fns = [lambda n=n, f=f: f(n) for f in (flags, lamport) for n in rows]
    times = _rank_min_us(fns, device)
    flags_us, lamport_us = times[:len(rows)], times[len(rows):]
    served = lamport_rows(rows, flags_us, lamport_us, bool(agreed.item()))
    logger.info("fused all-reduce: Lamport kernel up to %d rows (µs per call, flags / Lamport: %s)%s", served,
                ", ".join(f"{n} rows {f:.2f} / {lam:.2f}" for n, f, lam in zip(rows, flags_us, lamport_us)),
                "" if agreed.item() else "; NOT USED: its results differed from the flag kernel's")
    return served
