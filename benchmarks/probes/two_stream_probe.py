"""Two simulated ranks of the fused all-reduce kernels running at the same time on ONE GPU: rank 0's
kernels on one CUDA stream, rank 1's on another, each rank with its own buffer, flags and counters,
as on two GPUs but with local memory standing in for NVLink. Both protocols then really wait for
each other (the flag handshake of ops/triton_allreduce.py, the push-and-poll of
ops/triton_lamport.py), over many back-to-back calls in CUDA graphs; the results are checked against
the sum computed in float32.

    PYTHONPATH=$PWD/src python3 benchmarks/probes/two_stream_probe.py [--rows 1,4,16,64] [--reps 80] [--eager]

Up to 64 rows: both ranks' programs (one per row, one per SM at this size) must be resident at once
on the one GPU's 132 SMs, or a rank's spinning programs keep the other's from starting (the kernels
then time out), which two GPUs never see.

Prints µs per call (both ranks' kernels of a call run concurrently) for each protocol. Local loads
answer faster than a peer's over NVLink, so the difference between the protocols here is a lower
bound of the one on two GPUs (benchmarks/probes/allreduce_probe.py measures those).
"""
from __future__ import annotations

import argparse

import torch

from tritongen.ops import reference
from tritongen.ops.triton_allreduce import SLOTS, allreduce_add_rms_norm
from tritongen.ops.triton_lamport import fill_sentinel, inbox_elements, lamport_add_rms_norm


def _rank_calls(rows: int, h: int, lamport: bool, dev: torch.device):
    """(call(rank), outputs, want): each rank's next all-reduce of its fixed partial rows."""
    dt = torch.bfloat16
    own = 2 * SLOTS * h  # two halves of partial sums, then (Lamport) the inboxes, then the flags
    inbox = inbox_elements(2, SLOTS, h)
    bufs = [torch.empty(own + inbox, device=dev, dtype=dt) for _ in range(2)]
    g = torch.Generator(device="cpu").manual_seed(rows)
    parts = [torch.randint(-3, 4, (rows, h), generator=g).to(dev, dt) for _ in range(2)]
    for b, p in zip(bufs, parts):
        b[:rows * h] = p.flatten()  # half 0 (and half 1, which the flag protocol alternates to)
        b[SLOTS * h:SLOTS * h + rows * h] = p.flatten()
        fill_sentinel(b[own:])
    flags = [torch.zeros(2, SLOTS, dtype=torch.int32, device=dev) for _ in range(2)]
    epochs = [torch.zeros(SLOTS, dtype=torch.int32, device=dev) for _ in range(2)]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64, device=dev)
    flag_ptrs = torch.tensor([f.data_ptr() for f in flags], dtype=torch.int64, device=dev)
    residual = torch.randint(-3, 4, (rows, h), generator=g).to(dev, dt)
    weight = torch.ones(h, device=dev, dtype=dt)
    outs: list = [None, None]
    calls = [0, 0]

    def call(rank: int) -> None:
        half = calls[rank] % 2
        calls[rank] += 1
        if lamport:
            outs[rank] = lamport_add_rms_norm(ptrs, epochs[rank], half * SLOTS * h, own, SLOTS, rows, residual,
                                              weight, 1e-5, rank, 20.0)
        else:
            outs[rank] = allreduce_add_rms_norm(ptrs, flag_ptrs, epochs[rank], half * SLOTS * h, rows, residual,
                                                weight, 1e-5, rank, timeout_s=20.0)

    # ptrs / flag_ptrs hold only raw addresses: the buffers must live as long as `call` (torch.cuda.graph
    # empties the allocator's cache, which unmaps freed blocks: a kernel would then fault on them).
    call.buffers = (bufs, flags)  # type: ignore[attr-defined]
    # Compile each rank's kernel alone first: loading a module can wait for running kernels, so a rank
    # spinning on a peer that is still being compiled would never see it. Alone, a rank finds its
    # peer's signal (or rows) already there; then everything is reset.
    for rank in range(2):
        flags[rank][1 - rank] = 1
        for gen in range(3):
            bufs[rank][own:].view(3, 2, SLOTS, h)[gen, 1 - rank] = 0.0
        call(rank)
    torch.cuda.synchronize(dev)
    for rank in range(2):
        flags[rank].zero_()
        epochs[rank].zero_()
        fill_sentinel(bufs[rank][own:])
    calls[0] = calls[1] = 0
    want = reference.add_rms_norm((parts[0].float() + parts[1].float()).to(dt), residual, weight, 1e-5)
    return call, outs, want


def time_us(fn, reps: int, graph: bool) -> float:
    """µs per call of fn, `reps` calls after a warm-up, captured once in a CUDA graph when `graph`."""
    fn()
    torch.cuda.synchronize()
    run = fn
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / reps


def _time(call, reps: int, dev: torch.device, eager: bool = False) -> float:
    streams = [torch.cuda.Stream(dev), torch.cuda.Stream(dev)]

    def both() -> None:  # `reps` calls per rank, each rank on its stream
        main = torch.cuda.current_stream(dev)  # the capture stream while capturing
        for s in streams:
            s.wait_stream(main)
        for rank, s in enumerate(streams):
            with torch.cuda.stream(s):
                for _ in range(reps):
                    call(rank)
        for s in streams:
            main.wait_stream(s)

    return time_us(both, 3, graph=not eager) / reps  # one CUDA graph of both() unless eager


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,4,16,64")
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--reps", type=int, default=80)
    ap.add_argument("--protocols", default="flags,lamport")
    ap.add_argument("--eager", action="store_true", help="launch eagerly instead of in a CUDA graph")
    args = ap.parse_args()
    dev = torch.device("cuda")
    for rows in [int(r) for r in args.rows.split(",")]:
        line = f"rows {rows:>4}:"
        for name in args.protocols.split(","):
            call, outs, (want_h, want_s) = _rank_calls(rows, args.hidden, name == "lamport", dev)
            us = _time(call, args.reps, dev, args.eager)
            right = all(torch.equal(o[1], want_s) and torch.allclose(o[0].float(), want_h.float(), atol=2e-2)
                        for o in outs)
            line += f"  {name} {us:6.2f} us{'' if right else ' WRONG'}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
