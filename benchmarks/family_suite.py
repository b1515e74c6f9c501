"""Model families on one GPU (issue 23): kernel and engine parity, then batch-1 decode and offline
throughput of each family's real shape beside HF transformers in the same job.

Sections, in this order (each records its own failure and the next one still runs):
  tests     pytest: the Triton attention kernels against the reference (ALiBi, logit softcap, sliding
            window; prefill, chunked prefill, split and fused decode, CUDA graphs) and
            tests/models/test_families.py::test_cuda_engine_matches_hf (every family, float32 greedy
            and logprobs against HF's own class on CUDA, Triton backend, decode CUDA graphs)
  roofline  device copy bandwidth and bf16 GEMM rate: every fraction below is against these
  models    per --models: batch-1 decode (--input-len in / --output-len out) against the bandwidth
            floor with HF generate as the peer, then offline sharegpt-like through LLM.generate
            against the workload floor with HF continuous batching on a subset as the peer
  logits    bf16 and fp32 logits on the device (and HF's fp32 twin) against our fp32 CPU
            reference, for the tiny presets of the same families (--logits-models)
The sections are gpu_suite's (tritongen.bench.gpu_suite_*); the JSON is rewritten after each one.

    PYTHONPATH=$PWD/src TRITONGEN_CACHE=$PWD/.gpu/tokcache python3 benchmarks/family_suite.py \
        [--models dummy:bloom-7b1,dummy:qwen3-8b] [--num-prompts 500] [--peer-subset 16] [--skip-tests]
    PYTHONPATH=src python benchmarks/family_suite.py --smoke --skip-tests   # on CPU, tiny sizes
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from tritongen.bench import gpu_suite_engine as eng  # noqa: E402
from tritongen.bench import gpu_suite_workloads as wl  # noqa: E402
from tritongen.bench.gpu_suite_common import Row, SuiteConfig, SuiteContext, env_info, format_table  # noqa: E402

TESTS = ["tests/gpu/test_triton_kernels.py", "tests/models/test_families.py"]
TESTS_K = ("attention or split_decode or decode_splits or padding_slots or write_kv or fused_rotary or fused_decode "
           "or decode_counters or cpu_tensors or (cuda_engine_matches_hf and (Bloom or GPT2 or Qwen3))")


def _list(s: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in s.split(",") if x.strip())


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=_list, default=("dummy:bloom-7b1", "dummy:qwen3-8b"))
    ap.add_argument("--logits-models", type=_list, default=("dummy:tiny-bloom", "dummy:tiny-qwen3", "dummy:tiny-gpt2"))
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--iters", type=int, default=1, help="timed batch-1 repetitions after one warm-up")
    ap.add_argument("--num-prompts", type=int, default=500, help="offline sharegpt-like requests")
    ap.add_argument("--peer-subset", type=int, default=16, help="offline requests the HF peer runs (ours too)")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="CPU, float32, tiny presets and sizes (a check of this script)")
    ap.add_argument("--json-out", default=None, help="default $OUT/family_suite.json, else out/family_suite.json")
    return ap.parse_args(argv)


def section_tests(ctx: SuiteContext) -> tuple[dict, list[Row]]:
    cmd = [sys.executable, "-m", "pytest", *TESTS, "-q", "-p", "no:cacheprovider", "-k", TESTS_K]
    ctx.log("tests: " + " ".join(cmd))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=str(ROOT), capture_output=True, text=True, timeout=240)
    (Path(ctx.out_dir) / "family_suite_pytest.log").write_text(proc.stdout + proc.stderr)
    tail = proc.stdout.strip().splitlines()[-25:]
    print("\n".join("  | " + line for line in tail), flush=True)
    counts = wl._pytest_counts(proc.stdout)
    ok = counts["failed"] == 0 and counts["errors"] == 0 and proc.returncode == 0
    data = {"command": " ".join(cmd), "returncode": proc.returncode, "seconds": time.perf_counter() - t0, **counts}
    return data, [Row("tests", "attention kernels + family engines vs HF", ours=counts["passed"], unit="tests",
                      goal="none fail", met=ok, note=f"{counts['failed']} failed, {counts['skipped']} skipped")]


def model_section(model: str):
    """Batch-1 then offline for one model, each with its peer (one section per model, so that the
    JSON keeps each model's results as soon as it has them)."""
    def section(ctx: SuiteContext) -> tuple[dict, list[Row]]:
        bs1, r1 = eng.per_model(ctx, (model,), eng._bs1_one, "bs1")
        off, r2 = eng.per_model(ctx, (model,), wl._offline_one, "offline")
        ctx.release()
        return {"bs1": bs1[model], "offline": off[model]}, r1 + r2
    return section


def section_logits(ctx: SuiteContext) -> tuple[dict, list[Row]]:
    ctx.release()
    return eng.per_model(ctx, ctx.cfg.logits_models, wl._logits_one, "logits")


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = replace(SuiteConfig(), bs1_models=args.models, offline_models=args.models, logits_models=args.logits_models,
                  bs1_input_len=args.input_len, bs1_output_len=args.output_len, iters=args.iters,
                  num_prompts=args.num_prompts, peer_subset=args.peer_subset)
    if args.smoke:
        tiny = ("dummy:tiny-bloom",)
        cfg = replace(cfg, device="cpu", dtype="float32", bs1_models=tiny, offline_models=tiny, logits_models=tiny,
                      bs1_input_len=16, bs1_output_len=8, num_prompts=8, peer_subset=4, copy_bytes=32 << 20,
                      gemm_n=256, gemm_dtype="float32", clip_prompt=48, clip_output=8, kv_cache_memory_gb=0.05)
    out = Path(args.json_out) if args.json_out else Path(os.environ.get("OUT") or ROOT / "out") / "family_suite.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    ctx = SuiteContext(cfg, root=str(ROOT), out_dir=str(out.parent))
    sections = ([] if args.skip_tests else [("tests", section_tests)]) + [
        ("roofline", eng.section_roofline)] + [(m, model_section(m)) for m in cfg.bs1_models] + [
        ("logits", section_logits)]
    results = {"meta": env_info(cfg.device), "config": asdict(cfg), "sections": {}, "rows": []}
    rows: list[Row] = []
    for name, fn in sections:
        ctx.log(f"=== {name} ===")
        try:
            data, new = fn(ctx)
        except Exception as exc:  # noqa: BLE001 - a failed section is a result; the suite goes on
            traceback.print_exc()
            ctx.release()
            data, new = {"error": repr(exc)}, [Row(name, name, note=f"ERROR {exc!r}"[:120])]
        rows += new
        results["sections"][name] = data
        results["rows"] = [asdict(r) for r in rows]
        results["hardware"] = {"bandwidth_Bps": ctx.hw.bandwidth, "flops": ctx.hw.flops, "source": ctx.hw_source}
        out.write_text(json.dumps(results, indent=1, default=str))
        print(format_table(new), flush=True)
    ctx.release()
    print("\n" + format_table(rows), flush=True)
    return 1 if any(r.note.startswith("ERROR") or r.met is False and r.section == "tests" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
