"""Streamed responses per second of one `llm` stub (issue 29): a real tritonserver on CPU, N concurrent
gRPC streams of fixed length (ignore_eos), as the client sees them: responses/s, tokens per
response, ITL p50/p99, TPOT p50; and what each response costs the server side: CPU time of the
Python-backend stub of `llm` and of the tritonserver process, per response sent.

    python benchmarks/stub_responses.py [--concurrency 64,256] [--output-len 64] [--repeats 3]
        [--engine paced --step-ms 10 | --engine real]

--engine paced (default): the real `llm` model, AsyncLLM and EngineCore (scheduler, block manager,
detokenizer) over a runner that sleeps --step-ms per step (the GIL free, as while a GPU computes)
and samples words of the tiny model's tokenizer. On 2 shared CPU cores the tiny model's own steps
take 150-600 ms at 64-256 sequences, so the real engine, not the stub, would set the pace; the paced
one makes the stub's response path the thing measured, at GPU-like step times. --engine real
serves dummy:tiny-llama in an engine process (as on the GPU).
With ITL p50 close to TPOT p50 every step reaches the client as its own response; a ratio near k
means the stub sends one response per k steps (the issue's bursts). Starts its own tritonserver on
free 127.0.0.1 ports and stops it by PID; prints one row per run, then the medians.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tritongen.netutil import free_ports  # noqa: E402

PROMPT_WORDS = 12
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", default="64,256", help="comma-separated stream counts")
    ap.add_argument("--output-len", type=int, default=64, help="tokens per request (ignore_eos)")
    ap.add_argument("--requests-per-stream", type=int, default=2, help="requests = concurrency x this")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="dummy:tiny-llama")
    ap.add_argument("--engine", choices=("paced", "real"), default="paced")
    ap.add_argument("--step-ms", type=float, default=10.0, help="paced engine: the device time of one step")
    ap.add_argument("--stream-interval", type=int, default=None, help="the model parameter (default: 1)")
    ap.add_argument("--sender-threads", type=int, default=None, help="the model parameter (default: an eighth of the engine's max_num_seqs "
                    "within [8, 32])")
    ap.add_argument("--grpc-streams", type=int, default=None, help="client gRPC streams (default: min(N, 32))")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--keep-log", default=None, help="copy the server log here")
    return ap.parse_args(argv)


def engine_options(args: argparse.Namespace, max_seqs: int) -> dict:
    return {"model": args.model, "dtype": "float32", "device": "cpu", "seed": 0, "num_blocks": 4096,
            "max_num_seqs": max_seqs, "engine_process": args.engine == "real",
            "enable_prefix_caching": False}


# -- the paced engine (runs inside the stub) ---------------------------------------------------------

class PacedRunner:
    """A runner whose step takes `step_s` of wall time without the GIL and samples the next word of
    a fixed sentence: the engine's host work stays real, the device's share is a sleep."""

    def __init__(self, num_blocks: int, block_size: int, step_s: float, token_ids: list[int]) -> None:
        self.num_blocks, self.block_size, self.step_s, self.token_ids = num_blocks, block_size, step_s, token_ids

    def execute(self, sched):
        from tritongen.types import ModelOutput

        if sched.is_empty:
            return ModelOutput([])
        time.sleep(self.step_s)
        n = len(self.token_ids)
        return ModelOutput([self.token_ids[(s.start_pos + s.num_new_tokens) % n] for s in sched.seqs if s.do_sample])


def paced_model(step_ms: float):
    """The `llm` model class with a paced engine (what the benchmark's model.py serves)."""
    from tritongen.triton.llm_model import TritonPythonModel

    class PacedTritonPythonModel(TritonPythonModel):
        def _start_engine(self, kwargs: dict):
            from tritongen.config import EngineConfig
            from tritongen.core.engine import EngineCore, EngineLimits
            from tritongen.entrypoints.async_engine import AsyncLLM
            from tritongen.entrypoints.llm import _tokenizer_path
            from tritongen.fetch import resolve_model
            from tritongen.tokenizer import FastDecoder, load_tokenizer

            config = EngineConfig.from_kwargs(**{**kwargs, "engine_process": False})
            tokenizer = load_tokenizer(_tokenizer_path(config, resolve_model(config.model.model)))
            words = tokenizer.encode(" the quick brown fox jumps over the lazy dog and runs far away",
                                     add_special_tokens=False)
            runner = PacedRunner(config.cache.num_blocks, config.cache.block_size, step_ms / 1000.0, words)
            limits = EngineLimits(max_model_len=2048, vocab_size=len(tokenizer),
                                  eos_token_ids=(tokenizer.eos_token_id,))
            core = EngineCore(runner, tokenizer, limits, config.scheduler, False, decoder=FastDecoder(tokenizer))
            return AsyncLLM(engine=core)

    return PacedTritonPythonModel


PACED_MODEL_PY = """import sys
sys.path.insert(0, {bench_dir!r})
from stub_responses import paced_model

TritonPythonModel = paced_model({step_ms!r})
"""


def requests_for(n: int, output_len: int) -> list:
    from tritongen.bench.datasets import BenchRequest

    words = "the quick brown fox jumps over a lazy dog near river bank".split()
    return [BenchRequest(prompt=f"Request {i}: " + " ".join(words[(i + j) % len(words)] for j in range(PROMPT_WORDS)),
                         prompt_len=PROMPT_WORDS + 3, output_len=output_len) for i in range(n)]


def run_once(server, stub_pid: int, args: argparse.Namespace, concurrency: int) -> dict:
    from tritongen.bench.loadgen import LoadShape, run_serve_benchmark
    from tritongen.bench.results import summarize
    from tritongen.bench.triton_grpc import TritonGrpcTarget

    target = TritonGrpcTarget(server.grpc_url, "llm", None, timeout=300.0, concurrency=concurrency,
                              num_streams=args.grpc_streams)
    requests = requests_for(concurrency * args.requests_per_stream, args.output_len)
    shape = LoadShape(concurrency=concurrency, max_duration=600.0, grace=60.0, request_timeout=300.0)
    stub0, server0, client0 = cpu_seconds(stub_pid), cpu_seconds(server.process.pid), time.process_time()
    records, elapsed = asyncio.run(run_serve_benchmark(target, requests, shape, 0, False))
    stub_cpu = cpu_seconds(stub_pid) - stub0
    server_cpu = cpu_seconds(server.process.pid) - server0
    client_cpu = time.process_time() - client0
    s = summarize(records, elapsed, {"concurrency": concurrency})
    responses = sum(len(r.itl) + 1 for r in records if r.ok)
    return {"concurrency": concurrency, "ok": s["completed"], "errors": s["errors"], "elapsed_s": elapsed,
            "responses_s": responses / elapsed, "tokens_s": s["output_tok_s"],
            "tokens_per_response": s["completion_tokens"] / max(responses, 1),
            "itl_p50_ms": s["itl_ms"]["p50"], "itl_p99_ms": s["itl_ms"]["p99"], "tpot_p50_ms": s["tpot_ms"]["p50"],
            "stub_us_per_response": 1e6 * stub_cpu / max(responses, 1),
            "server_us_per_response": 1e6 * server_cpu / max(responses, 1),
            "stub_cpu": stub_cpu / elapsed, "server_cpu": server_cpu / elapsed, "client_cpu": client_cpu / elapsed,
            "first_error": s.get("first_error")}


COLUMNS = (("concurrency", "N", "d"), ("responses_s", "resp/s", ".0f"), ("tokens_s", "tok/s", ".0f"),
           ("tokens_per_response", "tok/resp", ".2f"), ("itl_p50_ms", "ITL p50", ".2f"),
           ("itl_p99_ms", "ITL p99", ".1f"), ("tpot_p50_ms", "TPOT p50", ".2f"),
           ("stub_us_per_response", "stub us/resp", ".0f"), ("server_us_per_response", "server us/resp", ".0f"),
           ("stub_cpu", "stub cpu", ".2f"), ("server_cpu", "srv cpu", ".2f"), ("client_cpu", "cli cpu", ".2f"))


def table(rows: list[dict]) -> str:
    head = " ".join(f"{label:>14}" for _, label, _ in COLUMNS)
    lines = [head]
    for r in rows:
        lines.append(" ".join(f"{format(r[key], fmt):>14}" if r.get(key) is not None else f"{'-':>14}"
                              for key, _, fmt in COLUMNS))
    return "\n".join(lines)


def medians(rows: list[dict]) -> list[dict]:
    out = []
    for n in sorted({r["concurrency"] for r in rows}):
        mine = [r for r in rows if r["concurrency"] == n]
        out.append({key: (statistics.median(r[key] for r in mine) if key != "concurrency" else n)
                    for key, _, _ in COLUMNS if all(r.get(key) is not None for r in mine)})
    return out


def main(argv=None) -> int:
    from tritongen.triton.launcher import TritonServer
    from tritongen.triton.repo import write_repository

    args = parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    with tempfile.TemporaryDirectory(prefix="tritongen-stubbench-") as tmp:
        repo = write_repository(Path(tmp) / "repo", engine_options(args, max(levels)),
                                stream_interval=args.stream_interval, sender_threads=args.sender_threads)
        if args.engine == "paced":
            (repo / "llm" / "1" / "model.py").write_text(
                PACED_MODEL_PY.format(bench_dir=str(ROOT / "benchmarks"), step_ms=args.step_ms))
        http, grpc, metrics = free_ports(3)
        log = Path(tmp) / "server.log"
        server = TritonServer(repo, http_port=http, grpc_port=grpc, metrics_port=metrics, log_file=log,
                              model_control="explicit", load_models=["llm"], exit_timeout_s=10)
        server.start()
        rows: list[dict] = []
        try:
            server.wait_ready(timeout=300)
            stub = next(s for s in server.poll_stubs() if s.model == "llm" and not s.zombie)
            run_once(server, stub.pid, argparse.Namespace(**{**vars(args), "requests_per_stream": 1}),
                     min(levels))  # warm-up: first-use costs stay out of the figures
            for rep in range(args.repeats):
                for n in levels:
                    row = run_once(server, stub.pid, args, n)
                    row["repeat"] = rep
                    rows.append(row)
                    print(f"repeat {rep} N={n}: {row['ok']} ok, {row['errors']} errors, "
                          f"{row['responses_s']:.0f} resp/s, ITL p50 {row['itl_p50_ms'] or 0:.2f} ms, "
                          f"TPOT p50 {row['tpot_p50_ms'] or 0:.2f} ms"
                          + (f", first error: {row['first_error']}" if row["first_error"] else ""), flush=True)
        finally:
            server.stop()
            if args.keep_log:
                Path(args.keep_log).write_bytes(log.read_bytes())
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1))
    engine = f"paced {args.step_ms:g} ms/step" if args.engine == "paced" else f"{args.model} (engine process)"
    print(f"\nper run (engine {engine}, output {args.output_len} tokens, {os.cpu_count()} CPUs):")
    print(table(rows))
    print(f"\nmedians of {args.repeats}:")
    print(table(medians(rows)))
    return 0 if all(r["errors"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
