"""FP8 decode GEMMs (M <= 16 rows against an fp8 [N, K] weight with per-channel scales), each kernel
timed in a CUDA graph that cycles through enough weight copies to defeat L2, beside the bf16 paths
on bf16 copies of the same shapes:

- `cuBLAS bf16`, `skinny bf16`: F.linear and the best triton_gemv.skinny_linear candidate on bf16
  weights (what the bf16 model runs; its bytes are twice the fp8 ones);
- `weight-only fp8`: ops.triton_fp8.fp8_linear, the fastest of its weight-only candidates (x @ w.T,
  the weight upcast to bf16 in registers);
- `tokens fp8`: ops.triton_fp8.fp8_tokens_linear, the quantized-token kernel (fp8 x fp8, the weight
  tile as the MMA's A operand) on x quantized beforehand, as when its producer quantizes it;
- `quant x`: the per-token quantization kernel alone (what a layer whose producer does not
  quantize adds to `tokens fp8`).

    PYTHONPATH=$PWD/src python3 benchmarks/probes/fp8_gemv_probe.py [--rows 1,8,16] [--shapes 7b,13b]

Prints every kernel's best µs and fp8-byte TB/s per shape and row count, and a table last. What it
measured on an H100 (docs/benchmarks.md, "FP8 weights"): the quantized-token product 10-19 % under
the weight-only kernel on the 7B shapes; the weight upcast as the A operand instead (a variant since
removed) 10-30 % over it.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))

from tritongen.ops.fp8 import Fp8Scales, quantize_weight  # noqa: E402

SHAPES = {
    "7b": [("qkv", 12288, 4096), ("o_proj", 4096, 4096), ("gate_up", 22016, 4096), ("down", 4096, 11008)],
    "13b": [("qkv", 15360, 5120), ("o_proj", 5120, 5120), ("gate_up", 27648, 5120), ("down", 5120, 13824)],
}


def best(fn_of_cfg, configs, weights) -> tuple[float, dict] | None:
    """(µs, config) of the fastest configuration, each timed as triton_gemv.graph_time_us does."""
    from tritongen.ops.triton_gemv import graph_time_us

    out = None
    for cfg in configs:
        try:
            us = graph_time_us(lambda w, c=cfg: fn_of_cfg(w, c), weights)
        except Exception as exc:  # noqa: BLE001 - a configuration that does not fit this GPU
            print(f"    {cfg}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            continue
        if out is None or us < out[0]:
            out = (us, cfg)
    return out


def time_shape(n: int, k: int, rows_list: list[int]) -> list[tuple[int, dict]]:
    """[(rows, {kernel: (µs, config)})] for one weight shape."""
    import torch.nn.functional as F

    from tritongen.ops import triton_fp8, triton_fp8_quant, triton_gemv
    from tritongen.ops.triton_gemv import graph_time_us

    ch = Fp8Scales("channel")
    copies = max(4, -(-(256 << 20) // (n * k)))
    dense = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    fp8 = [quantize_weight(w, ch) for w in dense]
    index = list(range(copies))
    weight_only = [c for c in triton_fp8.candidates(ch, k) if not c.get("QUANT")]
    out = []
    for rows in rows_list:
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        xq, xs = triton_fp8_quant.quantize_tokens(x)
        res = {
            "cuBLAS bf16": (graph_time_us(lambda w: F.linear(x, w), dense), None),
            "skinny bf16": best(lambda w, c: triton_gemv.skinny_linear(x, w, **c),
                                triton_gemv.candidates(torch.bfloat16), dense),
            "weight-only fp8": best(lambda i, c: triton_fp8.fp8_linear(x, fp8[i][0], fp8[i][1], ch, None, c),
                                    weight_only, index),
            "tokens fp8": best(
                lambda i, c: triton_fp8.fp8_tokens_linear(xq, xs, fp8[i][0], fp8[i][1], ch, None, c, x.dtype),
                triton_fp8.TOKEN_CONFIGS, index),
            "quant x": (graph_time_us(lambda _: triton_fp8_quant.quantize_tokens(x), [0]), None),
        }
        out.append((rows, {name: r for name, r in res.items() if r is not None}))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,8,16")
    ap.add_argument("--shapes", default="7b")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA (the kernels' numerics are tests/gpu/test_triton_fp8.py's)")
        return 0
    table = []
    for model in args.shapes.split(","):
        for name, n, k in SHAPES[model]:
            for rows, res in time_shape(n, k, [int(r) for r in args.rows.split(",")]):
                for kernel, (us, cfg) in res.items():
                    nbytes = rows * k * 3 if kernel == "quant x" else n * k * (2 if "bf16" in kernel else 1)
                    print(f"{model} {name:<8} {n}x{k} rows={rows:<3} {kernel:<16} {us:8.1f} us "
                          f"{nbytes / us / 1e6:5.2f} TB/s {cfg or ''}", flush=True)
                table.append((f"{model} {name} rows={rows}", {kernel: r[0] for kernel, r in res.items()}))
    kernels = list(table[0][1])
    print("\n" + f"{'shape':<24}" + "".join(f"{v:>17}" for v in kernels))
    for label, times in table:
        print(f"{label:<24}" + "".join(f"{times.get(v, float('nan')):>17.1f}" for v in kernels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
