"""Skinny decode GEMMs: cuBLAS (F.linear) against tritongen's Triton skinny_linear, per Llama weight
shape and batch rows, each timed in a CUDA graph of back-to-back calls that cycle through enough
weight copies to defeat the 50 MB L2 (a decode step never reuses a layer's weight either).

    PYTHONPATH=$PWD/src python3 benchmarks/probes/gemv_probe.py [--rows 1,4,8,16] [--models 7b,13b,13b-tp2]
        (also qwen3-moe, mixtral: their routers, attention projections and lm_head)
        [--configs sweep|candidates] [--splits 1,2,4] [--verbose]

`--configs candidates` times only triton_gemv.CANDIDATES (what select_kernels tries at load: a quick
run); `sweep` (the default) every block_n x block_k x warps x stages for each split count of
`--splits`. Prints, per shape and row count: cuBLAS and the best configuration without and with
split-K (µs and weight-read TB/s; every configuration's µs with --verbose), the whole-step saving at
batch 1 per model if every projection used the fastest kernel, and a compact table at the end.
"""
from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass
from typing import Optional

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
    # MoE: the router (N = the experts) is a GEMV with few output tiles
    "qwen3-moe": (48, [("router", 128, 2048), ("qkv", 5120, 2048), ("o_proj", 2048, 4096)], ("lm_head", 151936, 2048)),
    "mixtral": (32, [("router", 8, 4096), ("qkv", 6144, 4096), ("o_proj", 4096, 4096)], ("lm_head", 32000, 4096)),
}


@dataclass
class Result:
    label: str  # model and projection, e.g. "13b-tp2 o_proj"
    n: int
    k: int
    rows: int
    cublas_us: float
    plain: Optional[tuple[float, dict]]  # fastest configuration without split-K: (µs, config)
    split: Optional[tuple[float, dict]]  # fastest with split_k > 1

    def best(self) -> tuple[float, str]:
        """(µs, which) of the fastest of cuBLAS, plain and split-K."""
        options = [(self.cublas_us, "cuBLAS")] + [(r[0], name) for r, name in ((self.plain, "plain"),
                                                                                (self.split, "split")) if r]
        return min(options)


def sweep_configs(splits: list[int]) -> list[dict]:
    return [dict(block_n=bn, block_k=bk, num_warps=w, num_stages=st, split_k=sk)
            for sk, bn, bk, w, st in itertools.product(splits, (16, 32, 64), (128, 256), (4, 8), (3, 5))]


def short(cfg: Optional[dict]) -> str:
    if cfg is None:
        return "-"
    return f"n{cfg['block_n']} k{cfg['block_k']} w{cfg['num_warps']} s{cfg['num_stages']} x{cfg.get('split_k', 1)}"


def time_shape(label: str, n: int, k: int, rows_list: list[int], configs: list[dict], verbose: bool) -> list[Result]:
    """Every configuration against F.linear on one weight shape, per row count."""
    from tritongen.ops.triton_gemv import graph_time_us, skinny_linear

    nbytes = n * k * 2
    copies = max(2, -(-200_000_000 // nbytes))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies)]
    results = []
    for m in rows_list:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        want = F.linear(x, weights[0]).float()
        ref_us = graph_time_us(lambda w: F.linear(x, w), weights)
        best: dict[bool, Optional[tuple[float, dict]]] = {False: None, True: None}
        for cfg in configs:
            try:
                got = skinny_linear(x, weights[0], **cfg)
                torch.testing.assert_close(got.float(), want, atol=5e-2, rtol=5e-2)
                us = graph_time_us(lambda w, c=cfg: skinny_linear(x, w, **c), weights)
            except Exception as exc:  # noqa: BLE001 - a probe: skip a configuration that fails
                print(f"    {label} M={m} {short(cfg)}: {type(exc).__name__}: {str(exc)[:100]}")
                continue
            if verbose:
                print(f"    {label} M={m} {short(cfg):>22}: {us:8.2f} us ({ref_us / us:.2f}x cuBLAS)", flush=True)
            is_split = cfg.get("split_k", 1) > 1
            if best[is_split] is None or us < best[is_split][0]:
                best[is_split] = (us, cfg)
        r = Result(label, n, k, m, ref_us, best[False], best[True])
        us, which = r.best()
        print(f"{label:>16} [{n}x{k}] M={m:<2} cuBLAS {ref_us:7.2f} us | plain {_us(r.plain):>7} {_cfg(r.plain):>22}"
              f" | split {_us(r.split):>7} {_cfg(r.split):>22} | best {which} {nbytes / us / 1e6:.2f} TB/s", flush=True)
        results.append(r)
    del weights
    torch.cuda.empty_cache()
    return results


def _us(r: Optional[tuple[float, dict]]) -> str:
    return f"{r[0]:.2f}" if r else "-"


def _cfg(r: Optional[tuple[float, dict]]) -> str:
    return short(r[1] if r else None)


def print_table(results: list[Result]) -> None:
    print(f"\n{'shape':>30} {'M':>3} {'cuBLAS':>8} {'plain':>8} {'plain config':>22} {'split':>8} "
          f"{'split config':>22} {'best':>7} {'TB/s':>5}")
    for r in results:
        us, which = r.best()
        print(f"{r.label + f' [{r.n}x{r.k}]':>30} {r.rows:>3} {r.cublas_us:>8.2f} {_us(r.plain):>8} "
              f"{_cfg(r.plain):>22} {_us(r.split):>8} {_cfg(r.split):>22} "
              f"{which:>7} {r.n * r.k * 2 / us / 1e6:>5.2f}")


def main() -> None:
    from tritongen.ops.triton_gemv import CANDIDATES

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,4,8,16")
    ap.add_argument("--models", default="7b,13b,13b-tp2")
    ap.add_argument("--configs", choices=("sweep", "candidates"), default="sweep")
    ap.add_argument("--splits", default="1,2,4", help="split_k values of the sweep")
    ap.add_argument("--verbose", action="store_true", help="print every configuration's time")
    args = ap.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    configs = CANDIDATES if args.configs == "candidates" else sweep_configs([int(s) for s in args.splits.split(",")])
    results = []
    for model in args.models.split(","):
        layers, per_layer, head = SHAPES[model]
        saving_ms = 0.0
        for name, n, k in per_layer + [head]:
            for r in time_shape(f"{model} {name}", n, k, rows_list, configs, args.verbose):
                results.append(r)
                if r.rows == 1:
                    saving_ms += (r.cublas_us - r.best()[0]) * (1 if name == "lm_head" else layers) / 1000
        print(f"{model}: batch-1 step saving if each projection took the fastest kernel: {saving_ms:.3f} ms",
              flush=True)
    print_table(results)


if __name__ == "__main__":
    main()
