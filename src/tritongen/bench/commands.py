"""`tritongen bench serve | offline | latency | hf | roofline` (registered by tritongen.cli)."""
from __future__ import annotations

import argparse
import asyncio
import math
import sys
from pathlib import Path
from typing import Optional

from tritongen.bench.cli_common import add_dataset_args, load_bench_tokenizer, write_json


# -- serve ----------------------------------------------------------------------------------------

def _concurrency_levels(args: argparse.Namespace) -> list[Optional[int]]:
    if args.concurrency is None:
        return [None] if args.request_rate else [8]
    levels = [int(x) for x in str(args.concurrency).split(",") if x.strip()]
    if any(c < 1 for c in levels):
        raise ValueError("--concurrency values must be at least 1")
    if args.request_rate and len(levels) > 1:
        raise ValueError("with --request-rate, --concurrency is one cap on requests in flight, not a sweep")
    return levels


def _run_level(args, requests, tokenizer, concurrency: Optional[int], slos: dict) -> tuple[dict, list]:
    from tritongen.bench.loadgen import LoadShape, run_serve_benchmark
    from tritongen.bench.results import summarize
    from tritongen.bench.target_kinds import make_target

    rate = args.request_rate or math.inf
    target = make_target(args.target, args.url, args.model, tokenizer, concurrency or len(requests),
                         args.request_timeout, stream=args.stream, api_key=args.api_key,
                         grpc_streams=args.grpc_streams)
    shape = LoadShape(concurrency=concurrency, request_rate=rate, burstiness=args.burstiness, seed=args.seed,
                      max_duration=args.max_duration, grace=args.grace, request_timeout=args.request_timeout)
    records, elapsed = asyncio.run(run_serve_benchmark(target, requests, shape, args.warmup, not args.no_progress))
    label = {"target": args.target, "url": target.url, "model": args.model, "dataset": args.dataset,
             "concurrency": concurrency,
             "request_rate": None if math.isinf(rate) else rate,
             "burstiness": None if math.isinf(rate) else args.burstiness}
    return summarize(records, elapsed, label, slos), records


def cmd_serve(args: argparse.Namespace) -> int:
    from tritongen.bench.datasets import load_dataset
    from tritongen.bench.results import format_summary, parse_goodput, records_to_json

    if args.plot:
        from tritongen.bench.plots import require_matplotlib

        require_matplotlib()
    slos = parse_goodput(args.goodput)
    levels = _concurrency_levels(args)
    tokenizer = load_bench_tokenizer(args, args.model)
    requests = load_dataset(args.dataset, args.num_prompts, args.seed, tokenizer, args.corpus)
    runs = []
    for c in levels:
        summary, records = _run_level(args, requests, tokenizer, c, slos)
        print(format_summary(summary), flush=True)
        runs.append((summary, records))
    write_json(args.out, {"runs": [{"summary": s, "records": records_to_json(r)} for s, r in runs]})
    if args.plot:
        from tritongen.bench.plots import plot_latency_cdfs, plot_sweep

        out = Path(args.plot).expanduser()
        paths = plot_latency_cdfs([(f"c={s['concurrency']}" if s["concurrency"] else f"rate={s['request_rate']}", r)
                                   for s, r in runs], out)
        if len(runs) > 1:
            paths.append(plot_sweep([s for s, _ in runs], out))
        print("plots: " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0 if all(s["completed"] for s, _ in runs) else 1


def _add_serve(sub) -> None:
    from tritongen.bench.target_kinds import TARGETS

    p = sub.add_parser("serve", help="load a running server (OpenAI API or Triton) and report latency/throughput")
    p.add_argument("--target", choices=TARGETS, default="openai")
    p.add_argument("--url", default=None, help="server address (default: the target's local default port)")
    p.add_argument("--model", default=None, help="model name: OpenAI 'model' field, or the Triton model "
                                                  "(default llm; llm_bls for triton-bls)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--concurrency", default=None,
                   help="requests in flight (closed loop); a list such as 1,8,32,128 runs a sweep (default 8)")
    p.add_argument("--request-rate", type=float, default=None, help="open loop: arrivals per second")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrival gaps (1 = Poisson)")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True, help="stream (openai)")
    p.add_argument("--grpc-streams", type=int, default=None,
                   help="triton-grpc: gRPC streams (one connection each) the requests share (default min(concurrency, 32))")
    p.add_argument("--warmup", type=int, default=0, help="unrecorded requests sent first, one at a time")
    p.add_argument("--max-duration", type=float, default=3600.0, help="send no request after this many seconds")
    p.add_argument("--grace", type=float, default=60.0, help="then cancel what still runs after this many seconds")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--goodput", default=None, help="SLOs in ms, e.g. ttft:500,tpot:50[,e2e:10000]")
    p.add_argument("--out", default=None, help="write the summary and every request record as JSON")
    p.add_argument("--plot", default=None, help="directory for PNG plots (latency CDFs, throughput sweep)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_dataset_args(p)
    p.set_defaults(func=cmd_serve)


# -- offline / latency ----------------------------------------------------------------------------

def _engine_roofline(llm, pairs=None, batch_ctx=None) -> Optional[dict]:
    """H200 roofline floor when the engine runs on CUDA (meaningless on CPU)."""
    from tritongen.bench import roofline

    runner = llm.engine.runner
    if runner.device.type != "cuda":
        return None
    dtype = str(runner.dtype).replace("torch.", "")
    if pairs is not None:
        return roofline.dataset_floor(runner.arch, dtype, pairs, llm.config.scheduler.max_num_seqs)
    return roofline.decode_step_floor(runner.arch, dtype, batch_ctx)


def cmd_offline(args: argparse.Namespace) -> int:
    from tritongen import LLM
    from tritongen.bench.datasets import load_dataset
    from tritongen.bench.offline import format_offline, run_offline
    from tritongen.config_cli import engine_kwargs

    llm = LLM(**engine_kwargs(args))
    requests = load_dataset(args.dataset, args.num_prompts, args.seed, llm.tokenizer, args.corpus)
    summary = {"model": args.model or "default", "dataset": args.dataset, **run_offline(llm, requests)}
    floor = _engine_roofline(llm, pairs=[(r.prompt_len, r.output_len) for r in requests])
    if floor:
        summary["roofline"] = {**floor, "fraction": floor["floor_s"] / summary["elapsed_time"]}
    print(format_offline(summary))
    write_json(args.out, summary)
    return 0


def cmd_latency(args: argparse.Namespace) -> int:
    from tritongen import LLM
    from tritongen.bench.offline import format_latency, run_latency
    from tritongen.config_cli import engine_kwargs

    llm = LLM(**engine_kwargs(args))
    summary = {"model": args.model or "default",
               **run_latency(llm, args.batch_size, args.input_len, args.output_len, args.iters, args.warmup_iters,
                             args.seed)}
    floor = _engine_roofline(llm, batch_ctx=[args.input_len + args.output_len // 2] * args.batch_size)
    if floor:
        step_s = summary["decode_step_ms"]["mean"] / 1e3
        summary["roofline"] = {**floor, "floor_ms": floor["floor_s"] * 1e3, "fraction": floor["floor_s"] / step_s}
    print(format_latency(summary))
    write_json(args.out, summary)
    return 0


def _add_offline(sub) -> None:
    from tritongen.config_cli import add_engine_args

    p = sub.add_parser("offline", help="the whole dataset through LLM.generate (engine throughput, no server)")
    add_dataset_args(p, engine=True)
    p.add_argument("--out", default=None, help="write the summary as JSON")
    add_engine_args(p)  # its --seed seeds the dummy weights and the dataset
    p.set_defaults(func=cmd_offline)

    q = sub.add_parser("latency", help="per-step decode latency at a fixed batch size")
    q.add_argument("--batch-size", type=int, default=1)
    q.add_argument("--input-len", type=int, default=128)
    q.add_argument("--output-len", type=int, default=256)
    q.add_argument("--iters", type=int, default=3)
    q.add_argument("--warmup-iters", type=int, default=1)
    q.add_argument("--out", default=None, help="write the summary as JSON")
    add_engine_args(q)
    q.set_defaults(func=cmd_latency)


def register(subparsers) -> None:
    from tritongen.bench.commands_peer import add_hf, add_roofline

    bench = subparsers.add_parser("bench", help="benchmarks: serve | offline | latency | hf | roofline")
    sub = bench.add_subparsers(dest="bench_command", required=True)
    _add_serve(sub)
    _add_offline(sub)
    add_hf(sub)
    add_roofline(sub)
