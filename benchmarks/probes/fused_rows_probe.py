"""The fused all-reduce + add + RMSNorm kernel (ops/triton_allreduce.py) on ONE GPU, with the peer
simulated: rank 1's buffer is a second local tensor and its signal is set once, far ahead, so rank
0's kernel never waits. What this times is the kernel's own work per call (the per-row loop, its
loads and the norm), not NVLink (a local load answers in well under a µs, a peer's over NVLink in
about 1.5 µs): a change that hides load latency shows here at least in part, a change to the
handshake does not. benchmarks/probes/allreduce_probe.py times the real thing on two GPUs.

    PYTHONPATH=$PWD/src python3 benchmarks/probes/fused_rows_probe.py [--rows 1,128,256,512]
        [--module PATH]   # another copy of triton_allreduce.py to time instead (e.g. an older one)

Prints µs per call (CUDA graph of --reps calls) of allreduce_add_rms_norm per row count.
"""
from __future__ import annotations

import argparse
import importlib.util

import torch


def _load(path: str | None):
    if path is None:
        from tritongen.ops import triton_allreduce
        return triton_allreduce
    spec = importlib.util.spec_from_file_location("triton_allreduce_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def graph_us(fn, reps: int) -> float:
    """µs per call of fn: `reps` back-to-back calls captured in one CUDA graph, replayed 3 times."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (3 * reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,128,256,512")
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--reps", type=int, default=80)
    ap.add_argument("--module", default=None)
    args = ap.parse_args()
    tar = _load(args.module)
    dev, dt, h = torch.device("cuda"), torch.bfloat16, args.hidden
    rows_list = [int(r) for r in args.rows.split(",") if r]
    bufs = [torch.randn(max(rows_list), h, device=dev, dtype=dt) for _ in range(2)]
    flags = [torch.zeros(2, tar.SLOTS, dtype=torch.int32, device=dev) for _ in range(2)]
    flags[0][1] = 1 << 30  # rank 1 "signalled" every epoch this probe will reach
    epoch = torch.zeros(tar.SLOTS, dtype=torch.int32, device=dev)
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64, device=dev)
    flag_ptrs = torch.tensor([f.data_ptr() for f in flags], dtype=torch.int64, device=dev)
    weight = torch.randn(h, device=dev, dtype=dt)
    for rows in rows_list:
        residual = torch.randn(rows, h, device=dev, dtype=dt)
        us = graph_us(lambda: tar.allreduce_add_rms_norm(ptrs, flag_ptrs, epoch, 0, rows, residual, weight, 1e-5, 0,
                                                         timeout_s=0), args.reps)
        print(f"allreduce_add_rms_norm rows {rows:>4}: {us:7.2f} us", flush=True)


if __name__ == "__main__":
    main()
