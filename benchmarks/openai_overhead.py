"""HTTP overhead of the OpenAI server: requests/s at a fixed concurrency, AsyncLLM in process vs the
same engine behind `tritongen serve --frontend openai` (a separate process, driven over HTTP).

    python benchmarks/openai_overhead.py [--model dummy:tiny-llama] [--concurrency 32] [--requests 256]

Every request: a distinct ~20-token prompt, greedy, --output-len tokens with ignore_eos. The server
runs in its own process (as in production) and the client is httpx on asyncio; both share the
machine, so the paths alternate (--repeats) and each keeps its best run. Prints requests/s and
output tok/s per path, and server/in-process as a ratio.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

import httpx

from tritongen import AsyncLLM, SamplingParams
from tritongen.netutil import free_ports


def prompts(n: int) -> list[str]:
    return [f"Request {i}: write a short story about the number {i} and a lighthouse." for i in range(n)]


async def drive(n: int, concurrency: int, one) -> float:
    """Run `one(i)` for i < n with `concurrency` workers; returns the seconds taken."""
    next_i = iter(range(n))

    async def worker() -> None:
        for i in next_i:
            await one(i)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0


class InProcess:
    """AsyncLLM in this process."""

    def __init__(self, args) -> None:
        self.llm = AsyncLLM(args.model, device="cpu", dtype="float32", kv_cache_memory_gb=args.kv_gb)
        self.params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)

    def run(self, texts: list[str], concurrency: int) -> float:
        async def one(i: int) -> None:
            async for _ in self.llm.generate(texts[i], self.params):
                pass
        return asyncio.run(drive(len(texts), concurrency, one))

    def close(self) -> None:
        self.llm.shutdown()


class OverHttp:
    """`tritongen serve --frontend openai` in a subprocess, driven by httpx on asyncio."""

    def __init__(self, args) -> None:
        self.args = args
        port = free_ports(1)[0]
        cmd = [sys.executable, "-m", "tritongen.cli", "serve", "--frontend", "openai", "--model", args.model,
               "--port", str(port), "--device", "cpu", "--dtype", "float32", "--kv-cache-memory-gb", str(args.kv_gb)]
        self.proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(self.url + "/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("server did not start")
            time.sleep(0.2)

    def run(self, texts: list[str], concurrency: int, stream: bool) -> float:
        args = self.args

        async def go() -> float:
            limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
            async with httpx.AsyncClient(base_url=self.url, limits=limits, timeout=600) as http:
                async def one(i: int) -> None:
                    body = {"model": args.model, "prompt": texts[i], "max_tokens": args.output_len,
                            "temperature": 0, "ignore_eos": True, "stream": stream}
                    if stream:
                        async with http.stream("POST", "/v1/completions", json=body) as r:
                            async for _ in r.aiter_lines():
                                pass
                    else:
                        r = await http.post("/v1/completions", json=body)
                        r.raise_for_status()
                return await drive(len(texts), concurrency, one)
        return asyncio.run(go())

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="dummy:tiny-llama")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--kv-gb", type=float, default=0.25)
    ap.add_argument("--repeats", type=int, default=2,
                    help="alternate the three paths this many times and keep each one's best run")
    args = ap.parse_args()
    print(f"model={args.model} concurrency={args.concurrency} requests={args.requests} "
          f"output_len={args.output_len} cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}")
    texts = prompts(args.requests)
    local, remote = InProcess(args), OverHttp(args)
    paths = {"AsyncLLM in process": lambda t: local.run(t, args.concurrency),
             "HTTP server, non-streaming": lambda t: remote.run(t, args.concurrency, stream=False),
             "HTTP server, streaming (SSE)": lambda t: remote.run(t, args.concurrency, stream=True)}
    best = {name: float("inf") for name in paths}
    try:
        for run in paths.values():
            run(texts[: args.concurrency])  # warm-up
        for _ in range(args.repeats):
            for name, run in paths.items():
                best[name] = min(best[name], run(texts))
    finally:
        remote.close()
        local.close()
    base = args.requests / best["AsyncLLM in process"]
    print(f"{'path':<30} {'req/s':>8} {'out tok/s':>10} {'vs in-process':>14}")
    for name, seconds in best.items():
        rps = args.requests / seconds
        print(f"{name:<30} {rps:>8.2f} {rps * args.output_len:>10.1f} {rps / base:>14.3f}")


if __name__ == "__main__":
    main()
