"""Decode attention over the paged cache, split-K ("flash-decoding") against one program per
(sequence, KV head): microseconds per call for the model shapes at small batches and several
context lengths, each call captured in a CUDA graph (as decode runs), caches larger than L2.

    PYTHONPATH=$PWD/src python3 benchmarks/probes/decode_attn_probe.py
"""
from __future__ import annotations

import argparse

import torch

from tritongen.ops import triton_attention as ta
from tritongen.ops.attention import build_attention_metadata
from tritongen.ops.triton_gemv import graph_time_us

SHAPES = {"7b": (32, 32), "13b": (40, 40), "13b-tp2": (20, 20), "llama3-8b": (32, 8)}  # (q heads, kv heads)


def time_case(heads: int, kv_heads: int, batch: int, ctx: int, split: bool, block: int = 16, d: int = 128) -> float:
    blocks_per_seq = -(-ctx // block)
    copies = 4  # distinct caches cycled through, so the context is read from HBM, not L2
    num_blocks = batch * blocks_per_seq
    caches = [torch.randn(2, num_blocks, block, kv_heads, d, device="cuda", dtype=torch.bfloat16)
              for _ in range(copies)]
    tables = [list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(batch)]
    meta = build_attention_metadata([1] * batch, [ctx] * batch, tables, block, "cuda")
    q = torch.randn(batch, heads, d, device="cuda", dtype=torch.bfloat16)
    saved = ta.SPLIT_BELOW_PROGRAMS
    ta.SPLIT_BELOW_PROGRAMS = saved if split else 0
    try:
        return graph_time_us(lambda kv: ta.paged_attention_triton(q, kv, meta, d ** -0.5), caches, reps=5)
    finally:
        ta.SPLIT_BELOW_PROGRAMS = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batches", default="1,2,4")
    ap.add_argument("--contexts", default="128,384,1024,4096")
    args = ap.parse_args()
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
