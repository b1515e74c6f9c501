"""The row kernels that quantize their output per token for the FP8 GEMMs, by warps per program:
SiLU·mul (`_silu_mul_fp8_kernel`, one program per row, the row in registers) against SiLU·mul in
bf16 followed by the per-token quantization kernel, and the RMSNorm pair (`_add_rms_norm_kernel`
with and without its quantizing epilogue). Microseconds per call at decode row counts, each call in
a CUDA graph cycling through enough inputs to leave L2 (ops.triton_gemv.graph_time_us).

    PYTHONPATH=$PWD/src python3 benchmarks/probes/rowwise_fp8_probe.py --rows 1,8,16 --widths 11008,13824,14336
"""
from __future__ import annotations

import argparse

import torch
import triton

from tritongen.ops import triton_elementwise as te
from tritongen.ops.triton_fp8_quant import quantize_tokens
from tritongen.ops.triton_gemv import graph_time_us

WARPS = (4, 8, 16, 32)


def silu_fp8_us(rows: int, n: int, warps: int, copies: int = 8) -> float:
    gu = [torch.randn(rows, 2 * n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    q = torch.empty(rows, n, device="cuda", dtype=torch.float8_e4m3fn)
    qs = torch.empty(rows, 1, device="cuda", dtype=torch.float32)
    block = triton.next_power_of_2(n)

    def run(x):
        te._silu_mul_fp8_kernel[(rows,)](x, x[:, n:], q, qs, x, x.stride(0), x.stride(0), n, BLOCK=block,
                                         num_warps=warps)
    return graph_time_us(run, gu)


def silu_then_quant_us(rows: int, n: int, copies: int = 8) -> tuple[float, float]:
    gu = [torch.randn(rows, 2 * n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    alone = graph_time_us(lambda x: te.silu_and_mul(x[:, :n], x[:, n:]), gu)
    both = graph_time_us(lambda x: quantize_tokens(te.silu_and_mul(x[:, :n], x[:, n:])), gu)
    return alone, both


def norm_us(rows: int, n: int, warps: int, quant: bool, copies: int = 8) -> float:
    xs = [torch.randn(2, rows, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
    s = torch.empty_like(y)
    q = torch.empty(rows, n, device="cuda", dtype=torch.float8_e4m3fn)
    qs = torch.empty(rows, 1, device="cuda", dtype=torch.float32)

    def run(x):
        te._add_rms_norm_kernel[(rows,)](x[0], x[1], w, s if quant else y, s, q if quant else None,
                                         qs if quant else None, n, n, n, 1e-5, 0.0,
                                         BLOCK=triton.next_power_of_2(n), OFFSET=False, QUANT=quant, num_warps=warps)
    return graph_time_us(run, xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,8,16")
    ap.add_argument("--widths", default="11008,13824,14336", help="SiLU·mul widths (intermediate sizes)")
    ap.add_argument("--norm-widths", default="4096,5120")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    print(f"{'kernel':34s} {'N':>6s} {'rows':>4s} " + " ".join(f"{f'{w} warps':>9s}" for w in WARPS)
          + f" {'chosen':>7s}")
    for n in (int(v) for v in args.widths.split(",")):
        for r in rows:
            times = [silu_fp8_us(r, n, w) for w in WARPS]
            alone, both = silu_then_quant_us(r, n)
            chosen = te.wide_row_warps(triton.next_power_of_2(n))
            print(f"{'silu_mul_fp8 (one launch)':34s} {n:6d} {r:4d} " + " ".join(f"{t:9.2f}" for t in times)
                  + f" {chosen:7d}   bf16 silu_mul {alone:.2f}, + quantize_tokens {both:.2f}", flush=True)
    for n in (int(v) for v in args.norm_widths.split(",")):
        for r in rows:
            for quant in (False, True):
                times = [norm_us(r, n, w, quant) for w in WARPS[:3]]
                print(f"{'add_rms_norm' + (' fp8' if quant else ' bf16'):34s} {n:6d} {r:4d} "
                      + " ".join(f"{t:9.2f}" for t in times) + f" {'':>9s} {4:7d}", flush=True)


if __name__ == "__main__":
    main()
