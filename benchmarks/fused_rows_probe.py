"""The fused all-reduce + add + RMSNorm kernels (ops/triton_allreduce.py) on ONE GPU, with the peer
simulated: rank 1's buffer is a second local tensor and its signal is set once, far ahead, so rank
0's kernel never waits. What this times is the kernel's own work per call — the per-row loop, its
loads and the norm — not NVLink (a local load answers in well under a µs, a peer's over NVLink in
about 1.5 µs): a change that hides load latency shows here at least in part, a change to the
handshake does not. benchmarks/allreduce_probe.py times the real thing on two GPUs.

    PYTHONPATH=$PWD/src python3 benchmarks/fused_rows_probe.py [--rows 1,128,256,512] [--gemm-rows 1,2,4]
        [--module PATH]   # another copy of triton_allreduce.py to time instead (e.g. an older one)

Prints µs per call (CUDA graph of --reps calls) for allreduce_add_rms_norm and, with --gemm-rows,
gemm_allreduce_add_rms_norm over a TP=2 13B o_proj ([5120 x 2560]) against the same work in two
launches (the skinny GEMM, then allreduce_add_rms_norm).
"""
from __future__ import annotations

import argparse
import importlib.util

import torch

from pdl_probe import time_us  # a sibling script: benchmarks/ is on sys.path when run as a script


def _load(path: str | None):
    if path is None:
        from tritongen.ops import triton_allreduce
        return triton_allreduce
    spec = importlib.util.spec_from_file_location("triton_allreduce_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _graph_us(fn, reps: int) -> float:
    """µs per call of fn, `reps` back-to-back calls captured in one CUDA graph (pdl_probe's timer)."""
    return time_us(lambda: [fn() for _ in range(reps)], 3, graph=True) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,128,256,512")
    ap.add_argument("--gemm-rows", default="1,2,4")
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--gemm-k", type=int, default=2560)
    ap.add_argument("--reps", type=int, default=80)
    ap.add_argument("--module", default=None)
    args = ap.parse_args()
    tar = _load(args.module)
    from tritongen.ops.triton_gemv import skinny_linear

    dev, dt, h = torch.device("cuda"), torch.bfloat16, args.hidden
    rows_list = [int(r) for r in args.rows.split(",") if r]
    gemm_rows = [int(r) for r in args.gemm_rows.split(",") if r]
    max_rows = max(rows_list + gemm_rows)
    bufs = [torch.randn(max_rows, h, device=dev, dtype=dt) for _ in range(2)]
    flags = [torch.zeros(2, tar.SLOTS, dtype=torch.int32, device=dev) for _ in range(2)]
    flags[0][1] = 1 << 30  # rank 1 "signalled" every epoch this probe will reach
    epoch = torch.zeros(tar.SLOTS, dtype=torch.int32, device=dev)
    count = torch.zeros(1, dtype=torch.int32, device=dev)
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64, device=dev)
    flag_ptrs = torch.tensor([f.data_ptr() for f in flags], dtype=torch.int64, device=dev)
    weight = torch.randn(h, device=dev, dtype=dt)
    for rows in rows_list:
        residual = torch.randn(rows, h, device=dev, dtype=dt)
        us = _graph_us(lambda: tar.allreduce_add_rms_norm(ptrs, flag_ptrs, epoch, 0, rows, residual, weight, 1e-5, 0,
                                                          timeout_s=0), args.reps)
        print(f"allreduce_add_rms_norm       rows {rows:>4}: {us:7.2f} us", flush=True)
    ws = [torch.randn(h, args.gemm_k, device=dev, dtype=dt) / args.gemm_k ** 0.5 for _ in range(8)]
    cfg = dict(block_n=64, block_k=256, num_warps=4, num_stages=5)
    for rows in gemm_rows:
        x = torch.randn(rows, args.gemm_k, device=dev, dtype=dt)
        residual = torch.randn(rows, h, device=dev, dtype=dt)
        i = [0]

        def call():
            i[0] += 1
            return tar.gemm_allreduce_add_rms_norm(x, ws[i[0] % len(ws)], cfg, ptrs, flag_ptrs, epoch, count, 0,
                                                   residual, weight, 1e-5, 0, timeout_s=0)
        def apart():  # the same work in two launches: the skinny GEMM into the buffer, then the kernel
            i[0] += 1
            skinny_linear(x, ws[i[0] % len(ws)], **cfg, out=bufs[0][:rows])
            return tar.allreduce_add_rms_norm(ptrs, flag_ptrs, epoch, 0, rows, residual, weight, 1e-5, 0,
                                              timeout_s=0)
        print(f"gemm_allreduce_add_rms_norm  rows {rows:>4}: {_graph_us(call, args.reps):7.2f} us "
              f"(o_proj [{h} x {args.gemm_k}]); skinny GEMM + allreduce_add_rms_norm "
              f"{_graph_us(apart, args.reps):7.2f} us", flush=True)


if __name__ == "__main__":
    main()
