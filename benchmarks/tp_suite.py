"""Tensor parallelism on one host: TP=1 vs TP=N of the same model in one job (issue 7's measurement).

For each tensor_parallel_size: batch-1 decode latency (128 in / 256 out, prefill excluded) and
offline sharegpt-like-1000 throughput, bf16, dummy weights (identical at every TP size), no prefix
caching. Prints a table with the ratios against TP=1 and writes JSON.

    PYTHONPATH=$PWD/src TRITONGEN_CACHE=$PWD/.gpu/tokcache \
        python3 benchmarks/tp_suite.py --model dummy:llama-2-13b --tp 1,2 --json-out $OUT/tp_suite.json
    PYTHONPATH=src python benchmarks/tp_suite.py --smoke     # CPU, gloo, tiny model: the code path only

`--num-prompts 0` measures batch-1 latency only (about a third of the device time of a full run).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import time


def _log(msg: str, t0: float = time.perf_counter()) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)


def _measure(args: argparse.Namespace, spec: str) -> dict:
    """One engine: spec is TP or TP@MAX_NUM_SEQS (more KV per rank can hold a larger batch)."""
    import torch

    from tritongen import LLM
    from tritongen.bench.datasets import BenchRequest, load_dataset
    from tritongen.bench.offline import model_prompts, run_latency, run_offline

    tp, _, seqs = spec.partition("@")
    kw = {"num_blocks": args.num_blocks} if args.num_blocks else {}
    if seqs:
        kw["max_num_seqs"] = int(seqs)
    _log(f"loading {args.model} tp={tp} {kw}")
    llm = LLM(args.model, dtype=args.dtype, device=args.device, tensor_parallel_size=int(tp),
              enable_prefix_caching=False, **kw)
    try:
        result: dict = {"tp": spec, "kv_blocks": llm.engine.runner.num_blocks}
        shard = getattr(getattr(llm.engine.runner, "runner", None), "shard", None)  # rank 0's ModelRunner
        peers = getattr(getattr(shard, "symmetric", None), "peers", None)
        if peers is not None:
            result["lamport_rows"] = peers.lamport_rows  # the load-time protocol choice (parallel.calibrate)
            _log(f"fused all-reduce: the Lamport kernel serves batches up to {peers.lamport_rows} rows")
        _log(f"ready: {result['kv_blocks']} KV blocks; batch-1 latency")
        result["bs1"] = run_latency(llm, 1, args.input_len, args.output_len, iters=args.iters)
        _log(f"bs1 {result['bs1']['decode_step_ms']['mean']:.3f} ms/step")
        if args.num_prompts <= 0:
            return result
        _log(f"offline {args.dataset}")
        reqs = load_dataset(args.dataset, args.num_prompts, 0, llm.tokenizer)
        reqs = [BenchRequest(ids, len(ids), r.output_len) for ids, r in zip(model_prompts(llm, reqs), reqs)]
        result["offline"] = run_offline(llm, reqs)
        _log(f"offline {result['offline']}")
        return result
    finally:
        llm.shutdown()
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _measure_in_subprocess(args: argparse.Namespace, spec: str) -> dict:
    """Each configuration in a fresh process: nothing (GPU memory, process group) carries over."""
    import subprocess
    import sys
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [sys.executable, __file__, *_forwarded(args), "--one", spec, "--json-out", f.name]
        proc = subprocess.run(cmd, timeout=args.timeout_per_config)
        if proc.returncode != 0:
            raise RuntimeError(f"configuration {spec} failed with exit code {proc.returncode}")
        with open(f.name) as fh:
            return json.load(fh)


def _forwarded(args: argparse.Namespace) -> list[str]:
    names = ("model", "dtype", "device", "dataset", "num_prompts", "input_len", "output_len", "iters", "num_blocks")
    out = []
    for n in names:
        v = getattr(args, n)
        if v is not None:
            out += [f"--{n.replace('_', '-')}", str(v)]
    return out


def _table(results: list[dict]) -> str:
    base = results[0]
    header = f"{'tp':>6} {'bs1 ms/step':>12} {'bs1 tok/s':>10} {'x latency':>10}"
    lines = [header + (f" {'req/s':>8} {'out tok/s':>10} {'x thruput':>10}" if "offline" in base else "")]
    for r in results:
        step = r["bs1"]["decode_step_ms"]["mean"]
        lat = step / base["bs1"]["decode_step_ms"]["mean"]
        line = f"{r['tp']:>6} {step:>12.3f} {1000 / step:>10.1f} {lat:>10.3f}"
        off = r.get("offline")
        if off is not None:
            thr = off["output_tok_s"] / base["offline"]["output_tok_s"]
            line += f" {off['rps']:>8.2f} {off['output_tok_s']:>10.0f} {thr:>10.3f}"
        lines.append(line)
    lines.append("goals (issue 7): throughput x >= 1.7, batch-1 latency x <= 0.6 at TP=2")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="dummy:llama-2-13b")
    ap.add_argument("--tp", default="1,2", help="tensor parallel sizes, comma-separated (first = baseline); TP@N also sets max_num_seqs N")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dataset", default="sharegpt-like")
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--num-blocks", type=int, default=None)
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model, few prompts (checks the code path)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: measure one spec, write JSON
    ap.add_argument("--timeout-per-config", type=float, default=300.0)
    args = ap.parse_args()
    if args.smoke:
        args.model, args.dtype, args.device = "dummy:tiny-llama", "float32", "cpu"
        args.num_prompts = min(args.num_prompts, 8)
        args.input_len, args.output_len, args.iters, args.num_blocks = 16, 8, 1, 256
    if args.one:
        result = _measure(args, args.one)
        with open(args.json_out, "w") as f:
            json.dump(result, f)
        return
    results = [_measure_in_subprocess(args, spec) for spec in args.tp.split(",")]
    print(_table(results), flush=True)
    out = args.json_out or (os.path.join(os.environ["OUT"], "tp_suite.json") if os.environ.get("OUT") else None)
    if out:
        with open(out, "w") as f:
            json.dump({"model": args.model, "dtype": args.dtype, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
