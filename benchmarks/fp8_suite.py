"""FP8 on one GPU (issue 25), one job: the FP8 kernel tests on CUDA, the decode GEMMs of a model's
shapes (bf16 cuBLAS, the FP8 Triton kernel select_configs picks, per-token FP8 + torch._scaled_mm) per row
count, then per model bf16 against `--quantization fp8` on the same dummy weights: batch-1 decode
against each dtype's bandwidth floor, greedy token match and mean |Δlogprob| of fp8 against bf16,
and offline sharegpt-like throughput. Prints a table last; JSON to $OUT/fp8_suite.json.

    PYTHONPATH=$PWD/src TRITONGEN_CACHE=$PWD/.gpu/tokcache python3 benchmarks/fp8_suite.py \
        [--models dummy:llama-2-7b,dummy:llama-2-13b] [--num-prompts 1000]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from tritongen.bench import roofline  # noqa: E402
from tritongen.bench.gpu_suite_common import copy_bandwidth  # noqa: E402
from tritongen.bench.offline import run_latency, run_offline  # noqa: E402
from tritongen.models.loader import read_arch  # noqa: E402

ROWS: list[tuple] = []


def row(name: str, value: float, unit: str, note: str = "") -> None:
    ROWS.append((name, value, unit, note))
    print(f"{name:<58} {value:>10.4g} {unit:<7} {note}", flush=True)


def section_tests() -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/gpu/test_triton_fp8.py",
           "tests/unit/test_fp8.py"]
    proc = subprocess.run(cmd, cwd=str(ROOT), capture_output=True, text=True, timeout=300)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    print("\n".join("  | " + t for t in tail), flush=True)
    return {"returncode": proc.returncode, "tail": tail}


def section_gemms(model: str) -> dict:
    """Device time per call (CUDA graphs, as decode runs) of each decode GEMM shape: bf16 F.linear,
    the FP8 Triton kernel select_configs picks (weight-only, or quantized tokens where "QUANT" is in
    its config) with its tiling, and per-token FP8 + _scaled_mm. qkv and gate_up follow an RMSNorm,
    down SiLU·mul: as in the Llama family those ops can quantize for the product (Fp8Linear.producer),
    so for them every column includes that op (the plain one, or its quantizing variant before a
    quantized-token config), as select_configs times them."""
    from tritongen.ops.fp8 import Fp8Linear, Fp8Scales, _scaled_mm_linear
    from tritongen.ops.triton_fp8 import _producer_ops, select_configs
    from tritongen.ops.triton_gemv import graph_time_us

    arch = read_arch(model)
    h, i = arch.hidden_size, arch.intermediate_size
    q, kv = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
    shapes = {"qkv": (q + 2 * kv, h), "o": (h, q), "gate_up": (2 * i, h), "down": (h, i)}
    producers = {"qkv": "rms_norm", "gate_up": "rms_norm", "down": "silu_mul"}
    out = {}
    for name, (n, k) in shapes.items():
        dense = [torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        producer = producers.get(name)
        for scales in (Fp8Scales("channel"), Fp8Scales("block", (128, 128))):
            layers = [Fp8Linear.from_linear(d, scales) for d in dense]
            for layer in layers:  # as models/llama.py marks them
                layer.producer = producer
            chosen = select_configs(layers, torch.bfloat16)
            for rows in (1, 8, 16):
                x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
                plain = _producer_ops(producer, x)[0] if producer else (lambda: x)
                cfg, fp8_us = chosen[(n, k, scales.kind, producer, rows)]
                t = {"bf16": graph_time_us(lambda d: torch.nn.functional.linear(plain(), d.weight), dense),
                     "fp8_triton": fp8_us}
                if scales.kind == "channel":
                    t["fp8_scaled_mm"] = graph_time_us(
                        lambda layer: _scaled_mm_linear(plain(), layer.weight, layer.weight_scale, scales, None),
                        layers)
                if producer:
                    t[producer] = graph_time_us(lambda _: plain(), dense)
                key = f"{name} {n}x{k} {scales.kind} rows={rows}"
                out[key] = {**t, "config": cfg}
                gemm_us = fp8_us - t.get(producer, 0.0)
                row(f"gemm {key}", t["bf16"] / fp8_us, "x bf16",
                    ", ".join(f"{m} {v:.1f} us" for m, v in t.items())
                    + f"; fp8 bytes at {n * k / gemm_us / 1e6:.2f} TB/s less the plain {producer or 'op'}; {cfg}")
    return out


# label -> (quantization, kv_cache_dtype)
VARIANTS = {"bf16": (None, "auto", False), "fp8": ("fp8", "auto", False), "fp8+kv": ("fp8", "fp8", False),
            "fp8+head": ("fp8", "auto", True)}
"""label: (quantization, kv_cache_dtype, quantize_lm_head)."""


def variant_floor(arch, bw: float, context: int, label: str) -> float:
    """Batch-1 decode floor of a variant: bf16 or FP8 linear weights (lm_head bf16 unless the variant
    quantizes it), and a bf16 or FP8 (one byte an element) KV cache."""
    quant, kv, head = VARIANTS[label]
    floor = roofline.decode_step_floor(arch, "bfloat16", [context], roofline.Hardware(bandwidth=bw), quant,
                                       "fp8" if kv == "fp8" else None)["floor_s"]
    return floor - (arch.vocab_size * arch.hidden_size / bw if head else 0.0)  # memory-bound: a byte less a weight


def section_model(model: str, args, bw: float, tokenizer) -> dict:
    from tritongen import LLM, SamplingParams
    from tritongen.bench.datasets import load_dataset

    arch = read_arch(model)
    context = args.input_len + args.output_len // 2
    labels = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(labels) - set(VARIANTS))
    if unknown or "bf16" not in labels:
        raise SystemExit(f"--variants takes bf16 and any of {', '.join(VARIANTS)}; got {args.variants!r}")
    requests = load_dataset("sharegpt-like", args.num_prompts, 0, tokenizer) if args.num_prompts else []
    g = torch.Generator().manual_seed(1)
    probes = [torch.randint(100, arch.vocab_size, (n,), generator=g).tolist() for n in (16, 64, 128, 256)] * 2
    greedy = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True, logprobs=0)
    data, answers = {}, {}
    for label in labels:
        quant, kv, head = VARIANTS[label]
        floor = variant_floor(arch, bw, context, label)
        t0 = time.perf_counter()
        llm = LLM(model, dtype=args.dtype, device=args.device, quantization=quant, kv_cache_dtype=kv,
                  quantize_lm_head=head, seed=0,
                  tokenizer=args.tokenizer, **({"kv_cache_memory_gb": 0.1} if args.device == "cpu" else {}))
        load_s = time.perf_counter() - t0
        lat = run_latency(llm, 1, args.input_len, args.output_len, iters=2, warmup_iters=1)
        step_ms = lat["decode_step_ms"]["mean"]
        frac = floor * 1e3 / step_ms
        row(f"bs1 {model} {label} ms/step", step_ms, "ms",
            f"floor {floor * 1e3:.3f} ms -> fraction {frac:.3f}; load {load_s:.0f} s; "
            f"{llm.stats()['kv_blocks_total']} KV blocks")
        answers[label] = [(o.token_ids, [lp.logprob for lp in o.logprobs]) for o in llm.generate(probes, greedy)]
        off = run_offline(llm, requests) if args.num_prompts else {"rps": float("nan"), "output_tok_s": float("nan")}
        row(f"offline {model} {label} sharegpt-like-{args.num_prompts}", off["rps"], "req/s",
            f"{off['output_tok_s']:.0f} out tok/s")
        data[label] = {"bs1": lat, "fraction": frac, "floor_s": floor, "offline": off, "load_s": load_s}
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    bf = data["bf16"]
    for label in labels[1:]:
        match, total, dlp = 0, 0, []
        for (a_ids, a_lp), (b_ids, b_lp) in zip(answers["bf16"], answers[label]):
            same = next((j for j, (x, y) in enumerate(zip(a_ids, b_ids)) if x != y), len(a_ids))
            match, total = match + same, total + len(a_ids)
            dlp += [abs(x - y) for x, y in zip(a_lp[:same], b_lp[:same])]
        f8 = data[label]
        row(f"bs1 {model} {label} speed-up",
            bf["bs1"]["decode_step_ms"]["mean"] / f8["bs1"]["decode_step_ms"]["mean"], "x bf16")
        row(f"offline {model} {label} speed-up", f8["offline"]["rps"] / bf["offline"]["rps"], "x bf16")
        row(f"greedy {model} {label} tokens equal to bf16 (before first change)", match / total, "of all",
            f"mean |dlogprob| {sum(dlp) / max(len(dlp), 1):.4f} over {len(dlp)} tokens")
        f8["agreement"] = {"prefix_match": match / total, "mean_abs_dlogprob": sum(dlp) / max(len(dlp), 1)}
    return data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="dummy:llama-2-7b,dummy:llama-2-13b")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--num-prompts", type=int, default=1000, help="offline sharegpt-like requests (0: skip)")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--skip-gemms", action="store_true")
    ap.add_argument("--device", default="cuda", help="cpu: a check of this script (with a tiny model)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--variants", default="bf16,fp8,fp8+kv",
                    help="what runs per model, bf16 first: " + ", ".join(
                        f"{k} (quantization {q}, KV {kv}{', lm_head fp8' if h else ''})" for k, (q, kv, h) in VARIANTS.items()))
    args = ap.parse_args()
    from tritongen.fetch import resolve_model
    from tritongen.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer or resolve_model(None))
    results = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__}
    out = Path(os.environ.get("OUT") or ROOT / "out") / "fp8_suite.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if not args.skip_tests:
        results["tests"] = section_tests()
    bw = copy_bandwidth("cuda", 4 << 30) if args.device == "cuda" else roofline.H200_BANDWIDTH
    row("copy bandwidth", bw / 1e12, "TB/s")
    models = [m for m in args.models.split(",") if m]
    if not args.skip_gemms and args.device == "cuda":
        results["gemms"] = section_gemms(models[0])
    for model in models:
        try:
            results[model] = section_model(model, args, bw, tokenizer)
        except Exception as exc:  # noqa: BLE001 - the next model still runs
            import traceback

            traceback.print_exc()
            results[model] = {"error": repr(exc)}
        out.write_text(json.dumps(results, indent=1, default=str))
    print("\n" + "\n".join(f"{n:<58} {v:>10.4g} {u:<7} {note}" for n, v, u, note in ROWS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
