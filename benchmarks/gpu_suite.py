"""Issue 6's measurements in one go on the GPU machine; prints a table and writes every result as JSON.

Sections (in this order; --sections picks some):
  roofline     device copy bandwidth and bf16 GEMM rate: every fraction below is against these
  steps        decode step time at batch 8/32/128, context 512, against the step floor
  profile      torch.profiler over batch-1 decode steps: top kernels, kernel vs wall time per step
  bs1          batch-1 decode 128 in / 256 out, per --models; peer: HF generate on the same weights
  offline      sharegpt-like-1000 through LLM.generate; peer: HF continuous batching on a subset
  correctness  pytest tests/gpu, and bf16 / fp32 / HF logits against the fp32 CPU reference
  serving      benchmarks/gpu_serving.py at concurrency 128 (OpenAI server vs Triton), if present
Each section records its own failure and the suite goes on. The JSON is rewritten after every
section, so a run cut short still leaves what it measured.

    PYTHONPATH=$PWD/src TRITONGEN_CACHE=$PWD/.gpu/tokcache python3 benchmarks/gpu_suite.py \
        [--quick] [--sections roofline,bs1] [--models dummy:llama-2-7b] [--json-out PATH]
    PYTHONPATH=src python benchmarks/gpu_suite.py --smoke     # every section on CPU, tiny sizes

A device command may run 10 minutes, so split the full set (roofline is ~10 s; repeat it so that
each call's fractions use ceilings measured in that call):
  1. --sections roofline,steps,profile,bs1,offline,correctness     (7B; bs1 also 13B)
  2. --sections roofline,serving [--serving-models dummy:llama-2-13b]
  3. --sections roofline,steps,offline --steps-models dummy:llama-2-13b --offline-models dummy:llama-2-13b
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from tritongen.bench import gpu_suite_engine as eng  # noqa: E402
from tritongen.bench import gpu_suite_workloads as wl  # noqa: E402
from tritongen.bench.gpu_suite_common import Row, SuiteConfig, SuiteContext, env_info, format_table  # noqa: E402

SECTIONS = {"roofline": eng.section_roofline, "steps": eng.section_steps, "profile": eng.section_profile,
            "bs1": eng.section_bs1, "offline": wl.section_offline, "correctness": wl.section_correctness,
            "serving": wl.section_serving}
TINY = ("dummy:tiny-llama",)
SMOKE = dict(device="cpu", dtype="float32", bs1_models=TINY, steps_models=TINY, profile_model=TINY[0],
             offline_models=TINY, serving_models=TINY, logits_models=TINY, bs1_input_len=16, bs1_output_len=8,
             iters=1, step_batches=(2, 4), step_context=32, step_decode_tokens=4, profile_steps=5, num_prompts=12,
             peer_subset=4, copy_bytes=32 << 20, gemm_n=256, gemm_dtype="float32", serving_concurrency=4,
             serving_num_prompts=8, serving_timeout=300.0, clip_prompt=48, clip_output=8, kv_cache_memory_gb=0.05)
QUICK = dict(bs1_output_len=64, iters=1, step_decode_tokens=16, profile_steps=10, num_prompts=200, peer_subset=32,
             serving_num_prompts=200)


def _models(s: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in s.split(",") if m.strip())


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma list of: " + ", ".join(SECTIONS))
    ap.add_argument("--smoke", action="store_true", help="CPU, dummy:tiny-llama, float32, tiny sizes")
    ap.add_argument("--quick", action="store_true", help="fewer tokens and prompts (a first check on the device)")
    ap.add_argument("--json-out", default=None, help="default $OUT/gpu_suite.json, else out/gpu_suite.json")
    ap.add_argument("--models", type=_models, dest="bs1_models", help="bs1 models (default 7B and 13B)")
    ap.add_argument("--steps-models", type=_models, help="steps section models (default 7B)")
    ap.add_argument("--profile-model", help="profile section model (default 7B)")
    ap.add_argument("--offline-models", type=_models, help="offline section models (default 7B)")
    ap.add_argument("--serving-models", type=_models, help="serving section models (default 7B)")
    ap.add_argument("--step-batches", type=lambda s: tuple(int(x) for x in s.split(",")), help="default 8,32,128")
    ap.add_argument("--num-prompts", type=int, help="offline dataset size (default 1000)")
    ap.add_argument("--peer-subset", type=int, help="offline requests the HF peer runs (default 64)")
    ap.add_argument("--no-peer", dest="peer", action="store_const", const=False, help="skip the HF peers")
    ap.add_argument("--pytest-k", help="pytest -k for tests/gpu (default 'not default_model'; '' for all)")
    ap.add_argument("--serving-num-prompts", type=int, help="gpu_serving.py --num-prompts (default 1000)")
    ap.add_argument("--serving-args", help="extra arguments for benchmarks/gpu_serving.py")
    ap.add_argument("--serving-timeout", type=float, help="seconds per gpu_serving.py call (default 480)")
    ap.add_argument("--seed", type=int)
    return ap.parse_args(argv)


def build_config(args: argparse.Namespace) -> SuiteConfig:
    """Defaults, then --quick, then --smoke, then every flag given explicitly."""
    cfg = SuiteConfig()
    if args.quick:
        cfg = replace(cfg, **QUICK)
    if args.smoke:
        cfg = replace(cfg, **SMOKE)
    given = {k: v for k, v in vars(args).items() if v is not None and k in SuiteConfig.__dataclass_fields__}
    return replace(cfg, **given)


def json_path(args: argparse.Namespace) -> Path:
    if args.json_out:
        return Path(args.json_out).expanduser()
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / "gpu_suite.json"
    return ROOT / "out" / "gpu_suite.json"


def run_section(ctx: SuiteContext, name: str) -> tuple[dict, list[Row]]:
    try:
        return SECTIONS[name](ctx)
    except Exception as exc:  # noqa: BLE001 - a failed section is a result; the suite goes on
        ctx.log(f"{name} FAILED: {exc!r}")
        tb = traceback.format_exc()
        print(tb, flush=True)
        ctx.release()
        return {"error": repr(exc), "traceback": tb[-4000:]}, [Row(name, name, note=f"ERROR {exc!r}"[:120])]


def write_results(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=str))


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = build_config(args)
    names = [s for s in SECTIONS if s in {x.strip() for x in args.sections.split(",")}]
    unknown = {x.strip() for x in args.sections.split(",")} - set(SECTIONS)
    if unknown:
        raise SystemExit(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    path = json_path(args)
    path.parent.mkdir(parents=True, exist_ok=True)
    ctx = SuiteContext(cfg, root=str(ROOT), out_dir=str(path.parent))
    results = {"meta": env_info(cfg.device), "config": asdict(cfg), "sections": {}, "rows": []}
    rows: list[Row] = []
    ctx.log(f"gpu suite: sections {', '.join(names)}; JSON -> {path}")
    for name in names:
        ctx.log(f"=== {name} ===")
        data, new = run_section(ctx, name)
        rows += new
        results["sections"][name] = data
        results["rows"] = [asdict(r) for r in rows]
        results["hardware"] = {"bandwidth_Bps": ctx.hw.bandwidth, "flops": ctx.hw.flops, "source": ctx.hw_source}
        write_results(path, results)
        print(format_table(new), flush=True)
    ctx.release()
    met = [r for r in rows if r.met is not None]
    print("\n" + format_table(rows))
    print(f"\ngoals met {sum(r.met for r in met)}/{len(met)}; hardware: {ctx.hw_source}; JSON: {path}", flush=True)
    return 1 if any(r.note.startswith("ERROR") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
