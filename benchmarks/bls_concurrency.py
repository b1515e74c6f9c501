"""How many requests reach the engine at once through `llm` and through `llm_bls`: N concurrent
HTTP /generate requests against a tritonserver started here (tiny model, CPU), with the engine's
running-requests gauge sampled every 0.2 s. A front that caps concurrency shows a low peak.

    python benchmarks/bls_concurrency.py [--requests 128] [--max-tokens 24] [-- tritonserver args...]

e.g. `-- --backend-config=python,thread-pool-size=32` reproduces python_backend's default BLS pool.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from tritongen.netutil import free_ports  # noqa: E402

OPTS = {"model": "dummy:tiny-llama", "dtype": "float32", "device": "cpu", "num_blocks": 2048, "seed": 0}


def running(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    return max((float(line.split()[-1]) for line in text.splitlines()
                if line.startswith("tritongen_num_requests_running")), default=0.0)


def main() -> None:
    from tritongen.triton.launcher import TritonServer
    from tritongen.triton.repo import write_repository

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("server_args", nargs="*", help="extra tritonserver arguments (after --)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tritongen-bls-"))
    http, grpc, metrics = free_ports(3)
    server = TritonServer(write_repository(tmp / "repo", OPTS), http_port=http, grpc_port=grpc, metrics_port=metrics,
                          log_file=tmp / "server.log", extra_args=args.server_args)

    def one(i: int, model: str) -> float:
        body = {"text_input": f"Request {i} asks", "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}
        start = time.monotonic()
        req = urllib.request.Request(f"http://127.0.0.1:{http}/v2/models/{model}/generate", data=json.dumps(body).encode())
        urllib.request.urlopen(req, timeout=600).read()
        return time.monotonic() - start

    with server:
        for model in ("llm", "llm_bls"):
            one(0, model)
            peak, stop = [0.0], threading.Event()

            def watch() -> None:
                while not stop.is_set():
                    peak[0] = max(peak[0], running(metrics))
                    time.sleep(0.2)

            watcher = threading.Thread(target=watch)
            watcher.start()
            start = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(args.requests) as pool:
                lat = sorted(pool.map(lambda i, m=model: one(i, m), range(args.requests)))
            wall = time.monotonic() - start
            stop.set()
            watcher.join()
            print(f"{model:8s} {args.requests} concurrent /generate x {args.max_tokens} tokens: wall {wall:.1f} s, "
                  f"latency p50 {lat[len(lat) // 2]:.1f} s, max {lat[-1]:.1f} s, peak running in the engine {peak[0]:.0f}",
                  flush=True)


if __name__ == "__main__":
    main()
