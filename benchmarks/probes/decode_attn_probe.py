"""Decode attention over the paged cache, split-K ("flash-decoding") against one program per
(sequence, KV head): microseconds per call for the model shapes at small batches and several
context lengths, each call captured in a CUDA graph (as decode runs), caches larger than L2.
With --sweep, the unsplit kernel that large decode batches run, across key tiles (BLOCK_N),
warps and pipeline stages: microseconds and the K/V bytes' rate per configuration, beside the
device's copy rate and the rate of a plain sum over 4 GiB (reads only, as attention).

    PYTHONPATH=$PWD/src python3 benchmarks/probes/decode_attn_probe.py
    PYTHONPATH=$PWD/src python3 benchmarks/probes/decode_attn_probe.py --sweep --shapes 7b --batches 128 --contexts 512
    PYTHONPATH=$PWD/src python3 benchmarks/probes/decode_attn_probe.py --sweep --shapes 7b --batches 256 \
        --contexts 512 --configs 64/4/3 --kv-dtypes bf16,fp8
"""
from __future__ import annotations

import argparse

import torch

from tritongen.ops import triton_attention as ta
from tritongen.ops.attention import build_attention_metadata
from tritongen.ops.attention_metadata import FP8_KV_DTYPE, set_kv_cache_scales
from tritongen.ops.triton_gemv import graph_time_us

SHAPES = {"7b": (32, 32), "13b": (40, 40), "13b-tp2": (20, 20), "llama3-8b": (32, 8)}  # (q heads, kv heads)


def _case(heads: int, kv_heads: int, batch: int, ctx: int, block: int = 16, d: int = 128, shuffle: bool = False,
          fp8: bool = False):
    """(query, metadata, caches) of a decode batch: `batch` sequences of `ctx` cached tokens, each
    sequence's blocks adjacent, or (shuffle) scattered over the cache as a long-running server's are;
    bf16 caches, or (fp8) float8 e4m3 ones with scales of 1 (--kv-cache-dtype fp8)."""
    blocks_per_seq = -(-ctx // block)
    copies = 4  # distinct caches cycled through, so the context is read from HBM, not L2
    num_blocks = batch * blocks_per_seq
    caches = [torch.randn(2, num_blocks, block, kv_heads, d, device="cuda", dtype=torch.bfloat16)
              for _ in range(copies)]
    if fp8:
        caches = [c.to(FP8_KV_DTYPE) for c in caches]
        for c in caches:
            set_kv_cache_scales(c, 1.0, 1.0)
    order = torch.randperm(num_blocks).tolist() if shuffle else list(range(num_blocks))
    tables = [order[i * blocks_per_seq:(i + 1) * blocks_per_seq] for i in range(batch)]
    meta = build_attention_metadata([1] * batch, [ctx] * batch, tables, block, "cuda")
    q = torch.randn(batch, heads, d, device="cuda", dtype=torch.bfloat16)
    return q, meta, caches


def time_case(heads: int, kv_heads: int, batch: int, ctx: int, split: bool, d: int = 128) -> float:
    q, meta, caches = _case(heads, kv_heads, batch, ctx, d=d)
    saved = ta.SPLIT_BELOW_PROGRAMS
    ta.SPLIT_BELOW_PROGRAMS = saved if split else 0
    try:
        return graph_time_us(lambda kv: ta.paged_attention_triton(q, kv, meta, d ** -0.5), caches, reps=5)
    finally:
        ta.SPLIT_BELOW_PROGRAMS = saved


SWEEP = [(block_n, warps, stages) for block_n in (32, 64, 128) for warps in (2, 4, 8) for stages in (1, 2, 3, 4)]


def sweep(heads: int, kv_heads: int, batch: int, ctx: int, configs: list, shuffle: bool, d: int = 128,
          fp8: bool = False) -> None:
    """`configs` of the unsplit kernel on one decode batch; the default (64, 4, 3) first."""
    q, meta, caches = _case(heads, kv_heads, batch, ctx, d=d, shuffle=shuffle, fp8=fp8)
    gbytes = 2 * batch * ctx * kv_heads * d * caches[0].element_size() / 1e9  # K and V
    base = None
    for block_n, warps, stages in [(64, 4, 3)] + [c for c in configs if c != (64, 4, 3)]:
        out = torch.empty_like(q)
        try:
            us = graph_time_us(lambda kv: ta._paged_launch(q, kv, meta, out, d ** -0.5, None, None, None, block_n,
                                                            num_warps=warps, num_stages=stages), caches, reps=5)
        except Exception as e:  # shared memory beyond the SM's for the largest tiles
            print(f"  BLOCK_N {block_n:>3} warps {warps} stages {stages}: {type(e).__name__}", flush=True)
            continue
        base = base or us
        print(f"  BLOCK_N {block_n:>3} warps {warps} stages {stages}: {us:8.1f} us {gbytes / us * 1e3:5.2f} TB/s "
              f"x{base / us:.3f}", flush=True)


def read_rates(nbytes: int = 4 << 30) -> str:
    """The references for the sweep's TB/s: a device copy (read + write, the roofline's ceiling)
    and a sum over the same bytes (reads only, what attention does)."""
    from tritongen.bench.gpu_suite_common import copy_bandwidth, seconds_per_call

    x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    read = nbytes / seconds_per_call(lambda: x.sum(dtype=torch.float32), "cuda", 10)
    return f"copy {copy_bandwidth('cuda', nbytes) / 1e12:.2f} TB/s (read + write), sum {read / 1e12:.2f} TB/s (read)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batches", default="1,2,4")
    ap.add_argument("--contexts", default="128,384,1024,4096")
    ap.add_argument("--sweep", action="store_true", help="configurations of the unsplit kernel instead")
    ap.add_argument("--configs", default="all", help="with --sweep: all, or BLOCK_N/warps/stages,... (64/4/3,128/4/3)")
    ap.add_argument("--shuffle", default="0", help="with --sweep: 0, 1 or 0,1: blocks adjacent, scattered, or both")
    ap.add_argument("--kv-dtypes", default="bf16", help="with --sweep: bf16, fp8 or bf16,fp8 (the cache's element type)")
    args = ap.parse_args()
    if args.sweep:
        print(f"references over 4 GiB: {read_rates()}", flush=True)
        configs = SWEEP if args.configs == "all" else [tuple(map(int, c.split("/"))) for c in args.configs.split(",")]
        for name in args.shapes.split(","):
            for batch in map(int, args.batches.split(",")):
                for ctx, shuffle, kv in [(c, s, k) for c in map(int, args.contexts.split(","))
                                         for s in map(int, args.shuffle.split(",")) for k in args.kv_dtypes.split(",")]:
                    print(f"{name} batch {batch} ctx {ctx} {'scattered' if shuffle else 'adjacent'} blocks, {kv} cache",
                          flush=True)
                    sweep(*SHAPES[name], batch, ctx, configs, bool(shuffle), fp8=kv == "fp8")
        return
    print(f"{'shape':<10} {'batch':>5} {'ctx':>6} {'splits':>6} {'unsplit us':>10} {'split us':>9} {'x':>6}")
    for name in args.shapes.split(","):
        heads, kv_heads = SHAPES[name]
        for batch in map(int, args.batches.split(",")):
            splits = ta.decode_splits(batch, kv_heads)
            for ctx in map(int, args.contexts.split(",")):
                base = time_case(heads, kv_heads, batch, ctx, split=False)
                new = time_case(heads, kv_heads, batch, ctx, split=True) if splits > 1 else base
                print(f"{name:<10} {batch:>5} {ctx:>6} {splits:>6} {base:>10.2f} {new:>9.2f} {new / base:>6.3f}",
                      flush=True)


if __name__ == "__main__":
    main()
