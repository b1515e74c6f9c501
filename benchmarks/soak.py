"""Reliability soak (issue 21, docs/reliability.md): the malformed-input corpus and a cancel storm
against a real tritonserver and a real OpenAI server, both started here (tiny model, CPU), or
against servers you started (--triton-http/--triton-grpc/--triton-metrics, --openai).

    python benchmarks/soak.py --requests 10000 --concurrency 32 --cancel-fraction 0.3

Prints one table: corpus cases passed, storm requests sent / completed / cancelled, hangs, errors,
answers that differ from the prompt's solo answer, and the gauges after the storm (requests
running and waiting, KV-cache usage: all must be 0).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tritongen.bench import malformed, soak
from tritongen.netutil import free_ports

TINY = {"model": "dummy:tiny-llama", "dtype": "float32", "device": "cpu", "num_blocks": 512, "seed": 0,
        "max_num_seqs": 64}
OPENAI_MODEL = "tiny"


@contextlib.contextmanager
def triton_server(workdir: Path):
    from tritongen.triton.launcher import TritonServer
    from tritongen.triton.repo import write_repository

    repo = write_repository(workdir / "repo", TINY)
    http, grpc, metrics = free_ports(3)
    server = TritonServer(repo, http_port=http, grpc_port=grpc, metrics_port=metrics,
                          log_file=workdir / "triton.log", model_control="explicit", load_models=["*"])
    server.start()
    try:
        server.wait_ready(600)
        yield soak.Urls(http=server.http_url, grpc=server.grpc_url, metrics=server.metrics_url)
    finally:
        server.stop()


@contextlib.contextmanager
def openai_server(workdir: Path):
    (port,) = free_ports(1)
    args = [sys.executable, "-m", "tritongen.cli", "serve", "--frontend", "openai", "--port", str(port),
            "--served-model-name", OPENAI_MODEL, "--max-queue", "100000"]
    for key, value in TINY.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    log = open(workdir / "openai.log", "w")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the OpenAI server did not start; see {workdir / 'openai.log'}")
            time.sleep(0.5)
        yield soak.Urls(openai=url, openai_model=OPENAI_MODEL, metrics=f"{url}/metrics")
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def run_front(name: str, urls: soak.Urls, cases: list, paths: tuple, args) -> dict:
    corpus = asyncio.run(soak.check_corpus(cases, urls))
    storm = asyncio.run(soak.cancel_storm(urls, paths, args.requests, args.concurrency, args.cancel_fraction,
                                          args.max_tokens, args.seed))
    idle = soak.wait_idle(urls.metrics)
    for line in corpus.failures[:20] + storm.errors[:20] + storm.mismatched[:20]:
        print(f"  {name}: {line}")
    return {"front": name, "corpus": f"{corpus.passed}/{corpus.total}", "slowest_case_s": round(corpus.slowest_s, 2),
            "sent": storm.sent, "completed": storm.completed, "cancelled": storm.cancelled, "hangs": storm.hangs,
            "errors": len(storm.errors), "mismatched": len(storm.mismatched), "storm_s": round(storm.seconds, 1),
            "running_after": idle["tritongen_num_requests_running"],
            "waiting_after": idle["tritongen_num_requests_waiting"],
            "kv_usage_after": idle["tritongen_kv_cache_usage_ratio"], "by_path": dict(storm.by_path)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fronts", default="triton,openai")
    parser.add_argument("--requests", type=int, default=1000, help="storm requests per front")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--cancel-fraction", type=float, default=0.3)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tritongen-soak-") as tmp:
        workdir = Path(tmp)
        if "triton" in args.fronts:
            with triton_server(workdir) as urls:
                rows.append(run_front("triton", urls, malformed.triton_cases(),
                                      ("triton-grpc-stream", "triton-grpc-unary", "triton-sse", "triton-generate"),
                                      args))
        if "openai" in args.fronts:
            with openai_server(workdir) as urls:
                rows.append(run_front("openai", urls, malformed.openai_cases(OPENAI_MODEL), ("openai", "openai-sse"),
                                      args))
    keys = [k for k in rows[0] if k != "by_path"] if rows else []
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
        print(f"  {row['front']} paths: {row['by_path']}")
    bad = any(r["hangs"] or r["errors"] or r["mismatched"] or r["kv_usage_after"] or r["running_after"]
              or r["corpus"].split("/")[0] != r["corpus"].split("/")[1] for r in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
