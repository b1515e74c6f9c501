"""The MLP's gate/up GEMM with SiLU·mul in its epilogue (triton_gemv.gated_skinny_linear) against
the unfused pair the engine runs otherwise (the GEMM select_kernels picks, then the SiLU·mul kernel),
per Llama gate/up shape and row count, timed as select_gated_kernels times them at load (CUDA
graphs of back-to-back calls cycling through weight copies that defeat the L2).

    PYTHONPATH=$PWD/src python3 benchmarks/probes/gated_probe.py [--rows 1,8] [--models 7b,13b,13b-tp2]

Prints one line per shape and row count: the unfused pair, the best gated configuration, the
saving per call and per decode step (one gate/up per layer).
"""
from __future__ import annotations

import argparse

import torch

from tritongen.ops import triton_gemv

GATE_UP = {"7b": (32, 22016, 4096), "13b": (40, 27648, 5120), "13b-tp2": (40, 13824, 5120)}
"""Model -> (layers, stacked gate/up rows 2N, hidden K) of the Llama-2 shapes (13b-tp2: one TP=2 rank)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--models", default="7b,13b,13b-tp2")
    ap.add_argument("--copies", type=int, default=8, help="weight copies per shape (defeat the L2)")
    args = ap.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    print(f"{'shape':<16}{'rows':>5}{'unfused us':>12}{'gated us':>10}{'saved us':>10}{'per step us':>13}  config")
    for model in args.models.split(","):
        layers, n, k = GATE_UP[model]
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(args.copies)]
        gemm = triton_gemv.select_kernels(weights)  # the unfused GEMM choice, as at load
        for rows in rows_list:
            unfused, *gated = triton_gemv._time_gated_case((n, k, torch.bfloat16, rows), weights, gemm)
            best = min(range(len(gated)), key=gated.__getitem__)
            saved = unfused - gated[best]
            print(f"{model + ' gate_up':<16}{rows:>5}{unfused:>12.2f}{gated[best]:>10.2f}{saved:>10.2f}"
                  f"{saved * layers:>13.1f}  {triton_gemv.gated_candidates(torch.bfloat16)[best]}")
        del weights
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
