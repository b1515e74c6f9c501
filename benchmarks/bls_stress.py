"""Many concurrent llm_bls requests against a real tritonserver (CPU, tiny model): round times, the
llm_bls stub's CPU, and whether every stub survived (with the stacks of one that did not).

    python benchmarks/bls_stress.py --concurrency 256 --rounds 2 --runs 4

Each run starts its own server (max_num_seqs = the concurrency). docs/reliability.md, "Upstream",
quotes what it found: python_backend 24.10's stub can crash inside a BLS response iterator.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from tritongen.triton.launcher import TritonServer, find_stubs
from tritongen.triton.repo import write_repository


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def generate(url: str, body: dict, timeout: float) -> int:
    req = urllib.request.Request(f"http://{url}/v2/models/llm_bls/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0  # timed out: nobody answered


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(root: Path, args) -> bool:
    """One server, `rounds` rounds; True when every stub lived to the end."""
    engine = {"model": "dummy:tiny-llama", "dtype": "float32", "device": "cpu", "num_blocks": 2048, "seed": 0,
              "max_num_seqs": args.concurrency}
    repo = write_repository(root / "repo", engine)
    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          log_file=root / "server.log", model_control="explicit", load_models=["*"])
    server.start()
    try:
        server.wait_ready(300)
        stubs = {s.model: s.pid for s in find_stubs(server.process.pid)}
        body = {"text_input": "y", "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}
        for r in range(args.rounds):
            c0, t0 = cpu_seconds(stubs["llm_bls"]), time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                codes = list(pool.map(lambda _: generate(server.http_url, body, args.timeout), range(args.concurrency)))
            alive = {s.model for s in find_stubs(server.process.pid) if not s.zombie}
            print(f"  round {r}: {time.monotonic() - t0:.2f} s, llm_bls stub CPU "
                  f"{cpu_seconds(stubs['llm_bls']) - c0 if 'llm_bls' in alive else float('nan'):.2f} s, "
                  f"{codes.count(200)}/{len(codes)} ok", flush=True)
            if set(stubs) - alive:
                print(f"  stub(s) died: {sorted(set(stubs) - alive)}\n{server.crash_excerpt(3000)}")
                return False
        return True
    finally:
        server.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a client waits for its answer")
    ap.add_argument("--keep-logs", default=None, help="copy each run's server log into this folder")
    args = ap.parse_args(argv)
    survived = 0
    with tempfile.TemporaryDirectory(prefix="bls-stress-") as tmp:
        for run in range(args.runs):
            print(f"run {run}", flush=True)
            survived += one_run(Path(tmp) / f"run{run}", args)
            if args.keep_logs:
                Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
                shutil.copy(Path(tmp) / f"run{run}" / "server.log", Path(args.keep_logs) / f"run{run}.log")
    print(f"{survived}/{args.runs} runs without a dead stub")
    return 0 if survived == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
