"""Skinny decode GEMMs: cuBLAS (F.linear) against tritongen's Triton skinny_linear, per Llama weight
shape and batch rows, each timed in a CUDA graph of back-to-back calls that cycle through enough
weight copies to defeat the 50 MB L2 (a decode step never reuses a layer's weight either).

    PYTHONPATH=$PWD/src python3 benchmarks/gemv_probe.py [--rows 1,4,8,16] [--models 7b,13b,13b-tp2]

Prints, per shape and row count: microseconds and weight-read TB/s of cuBLAS and of the best
skinny_linear configuration, and the whole-step saving at batch 1 if every projection used the
faster of the two.
"""
from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F

# (name, N, K) of each projection; lm_head once per step, the others once per layer.
SHAPES = {
    "7b": (32, [("qkv", 12288, 4096), ("o_proj", 4096, 4096), ("gate_up", 22016, 4096), ("down", 4096, 11008)],
           ("lm_head", 32000, 4096)),
    "13b": (40, [("qkv", 15360, 5120), ("o_proj", 5120, 5120), ("gate_up", 27648, 5120), ("down", 5120, 13824)],
            ("lm_head", 32000, 5120)),
    "13b-tp2": (40, [("qkv", 7680, 5120), ("o_proj", 5120, 2560), ("gate_up", 13824, 5120), ("down", 5120, 6912)],
                ("lm_head", 16000, 5120)),
}
CONFIGS = [dict(block_n=bn, block_k=bk, num_warps=w, num_stages=st)
           for bn, bk, w, st in itertools.product((16, 32, 64), (128, 256), (4, 8), (3, 5))]


def main() -> None:
    from tritongen.ops.triton_gemv import graph_time_us, skinny_linear

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,4,8,16")
    ap.add_argument("--models", default="7b,13b,13b-tp2")
    args = ap.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    dev = torch.device("cuda")
    print(f"{'shape':>22} {'M':>3} {'cuBLAS us':>10} {'TB/s':>6} {'skinny us':>10} {'TB/s':>6} {'x':>6}  best config")
    for model in args.models.split(","):
        layers, per_layer, head = SHAPES[model]
        saving_ms = 0.0
        for name, n, k in per_layer + [head]:
            nbytes = n * k * 2
            copies = max(2, -(-200_000_000 // nbytes))
            weights = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies)]
            for m in rows_list:
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                ref_us = graph_time_us(lambda w: F.linear(x, w), weights)
                best = None
                for cfg in CONFIGS:
                    try:
                        got = skinny_linear(x, weights[0], **cfg)
                        torch.testing.assert_close(got.float(), F.linear(x, weights[0]).float(), atol=5e-2, rtol=5e-2)
                        us = graph_time_us(lambda w, c=cfg: skinny_linear(x, w, **c), weights)
                    except Exception as exc:  # noqa: BLE001 - a probe: skip a configuration that fails
                        print(f"    {name} M={m} {cfg}: {type(exc).__name__}: {str(exc)[:100]}")
                        continue
                    if best is None or us < best[0]:
                        best = (us, cfg)
                if best is None:
                    continue
                us, cfg = best
                print(f"{model + ' ' + name:>22} {m:>3} {ref_us:>10.2f} {nbytes / ref_us / 1e6:>6.2f} {us:>10.2f} "
                      f"{nbytes / us / 1e6:>6.2f} {ref_us / us:>6.2f}  {cfg}", flush=True)
                if m == 1:
                    saving_ms += max(0.0, ref_us - us) * (1 if name == "lm_head" else layers) / 1000
            del weights
            torch.cuda.empty_cache()
        print(f"{model}: batch-1 step saving if each projection took the faster kernel: {saving_ms:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
