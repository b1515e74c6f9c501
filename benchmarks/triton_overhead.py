"""Triton overhead, CPU, tiny model, concurrency 32: requests/s through (a) gRPC streaming to `llm`,
(b) HTTP /infer to `llm_bls`, (c) AsyncLLM in process; plus 64 concurrent llm_bls requests
(wall time vs the slowest one). Starts its own tritonserver on free 127.0.0.1 ports.

    python benchmarks/triton_overhead.py [--requests 128] [--concurrency 32] [--max-tokens 16] [--engine-process]
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import queue
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from tritongen.netutil import free_ports  # noqa: E402
OPTS = {"model": "dummy:tiny-llama", "dtype": "float32", "device": "cpu", "num_blocks": 1024, "seed": 0}


def params(i, max_tokens):
    return {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}, f"Request {i} says"


def run_pool(fn, n, concurrency):
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        lat = list(pool.map(fn, range(n)))
    return time.monotonic() - start, lat


def grpc_stream_one(url, max_tokens):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    def one(i):
        p, prompt = params(i, max_tokens)
        q = queue.Queue()
        client = grpcclient.InferenceServerClient(url)
        client.start_stream(callback=lambda result, error: q.put((result, error)))
        inputs = []
        for name, arr in (("text_input", np.array([prompt.encode()], dtype=object)), ("stream", np.array([True])),
                          ("sampling_parameters", np.array([json.dumps(p).encode()], dtype=object))):
            t = grpcclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
            t.set_data_from_numpy(arr)
            inputs.append(t)
        start = time.monotonic()
        client.async_stream_infer("llm", inputs, enable_empty_final_response=True)
        while True:
            result, error = q.get()
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        client.stop_stream()
        client.close()
        return time.monotonic() - start
    return one


def http_infer_one(url, max_tokens):
    import urllib.request

    def one(i):
        p, prompt = params(i, max_tokens)
        body = {"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": [prompt]},
                           {"name": "sampling_parameters", "shape": [1], "datatype": "BYTES", "data": [json.dumps(p)]}]}
        start = time.monotonic()
        req = urllib.request.Request(f"http://{url}/v2/models/llm_bls/infer", data=json.dumps(body).encode())
        urllib.request.urlopen(req, timeout=600).read()
        return time.monotonic() - start
    return one


def in_process(n, concurrency, max_tokens, opts):
    from tritongen import AsyncLLM, SamplingParams

    llm = AsyncLLM(**opts)

    async def main():
        sem = asyncio.Semaphore(concurrency)

        async def one(i):
            p, prompt = params(i, max_tokens)
            async with sem:
                async for _ in llm.generate(prompt, SamplingParams(**p)):
                    pass
        await one(0)  # warm-up
        start = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(n)))
        return time.monotonic() - start
    try:
        return asyncio.run(main())
    finally:
        llm.shutdown()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--engine-process", action="store_true",
                    help="the llm model (and the in-process baseline) run the engine loop in a child process")
    args = ap.parse_args()
    from tritongen.triton.launcher import TritonServer
    from tritongen.triton.repo import write_repository

    n, c, m = args.requests, args.concurrency, args.max_tokens
    tmp = tempfile.mkdtemp(prefix="tritongen-bench-")
    http, grpc, metrics = free_ports(3)
    opts = {**OPTS, "engine_process": args.engine_process}
    server = TritonServer(write_repository(Path(tmp) / "repo", opts), http_port=http, grpc_port=grpc,
                          metrics_port=metrics, log_file=Path(tmp) / "server.log")
    with server:
        grpc_stream_one(server.grpc_url, m)(0)  # warm-up
        wall_a, _ = run_pool(grpc_stream_one(server.grpc_url, m), n, c)
        wall_b, _ = run_pool(http_infer_one(server.http_url, m), n, c)
        wall_64, lat_64 = run_pool(http_infer_one(server.http_url, 64), 64, 64)
    wall_c = in_process(n, c, m, opts)
    rps = {"(a) gRPC stream -> llm": n / wall_a, "(b) HTTP infer -> llm_bls": n / wall_b,
           "(c) AsyncLLM in process": n / wall_c}
    print(f"{n} requests, concurrency {c}, {m} output tokens each, tiny model, CPU ({os.cpu_count()} cores)"
          f"{', engine process' if args.engine_process else ''}")
    for name, value in rps.items():
        print(f"  {name:28s} {value:7.2f} req/s   ({value / rps['(c) AsyncLLM in process']:.2f} x in-process)")
    print(f"64 concurrent llm_bls requests (64 tokens): wall {wall_64:.2f} s, slowest {max(lat_64):.2f} s, "
          f"fastest {min(lat_64):.2f} s")


if __name__ == "__main__":
    main()
