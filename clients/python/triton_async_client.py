#!/usr/bin/env python3
"""N concurrent generations over gRPC with asyncio (tritonclient.grpc.aio; pip install tritonclient[grpc]).

    python clients/python/triton_async_client.py --url 127.0.0.1:8001 --num-requests 8 --model llm_bls

`llm_bls` (non-decoupled) is asked with unary ModelInfer; `llm` (decoupled) needs a gRPC stream,
so each request gets its own stream, closed by the server after the request's last response.
Prints each request's latency and text, then the wall time and requests/s. The text goes to the
model as it is (no chat template): give it a prompt to continue.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

try:
    import numpy as np
    import tritonclient.grpc.aio as aioclient
    from tritonclient.utils import InferenceServerException
except ImportError as exc:  # one line, not a traceback
    sys.exit(f"{exc.name} is missing: pip install 'tritonclient[grpc]' "
             "(or tritongen's extra: pip install -e '.[clients]')")


def make_inputs(prompt: str, sampling: dict) -> list:
    tensors = {"text_input": np.array([prompt.encode("utf-8")], dtype=np.object_),
               "exclude_input_in_output": np.array([True]),
               "sampling_parameters": np.array([json.dumps(sampling).encode("utf-8")], dtype=np.object_)}
    inputs = []
    for name, arr in tensors.items():
        tensor = aioclient.InferInput(name, list(arr.shape), "BOOL" if arr.dtype == np.bool_ else "BYTES")
        tensor.set_data_from_numpy(arr)
        inputs.append(tensor)
    return inputs


def decode(result) -> str:
    return b"".join(result.as_numpy("text_output").reshape(-1)).decode("utf-8")


async def ask_unary(client, model: str, inputs: list, request_id: str) -> str:
    return decode(await client.infer(model, inputs, request_id=request_id))


async def ask_stream(client, model: str, inputs: list, request_id: str) -> str:
    async def one_request():  # the stream half-closes after it, so the server ends it when done
        yield {"model_name": model, "inputs": inputs, "request_id": request_id}

    text = []
    async for result, error in client.stream_infer(one_request()):
        if error is not None:
            raise error
        text.append(decode(result))
    return "".join(text)


async def timed(ask, client, model: str, inputs: list, request_id: str) -> tuple[float, str]:
    start = time.perf_counter()
    text = await ask(client, model, inputs, request_id)
    return time.perf_counter() - start, text


async def run(args) -> int:
    sampling = {"max_tokens": args.max_tokens, "temperature": args.temperature, "ignore_eos": args.ignore_eos}
    ask = ask_stream if args.model == "llm" or args.stream else ask_unary
    async with aioclient.InferenceServerClient(args.url) as client:
        start = time.perf_counter()
        outcomes = await asyncio.gather(*(timed(ask, client, args.model, make_inputs(args.prompt, sampling), str(i))
                                          for i in range(args.num_requests)), return_exceptions=True)
        wall = time.perf_counter() - start
    failed = 0
    for i, outcome in enumerate(outcomes):
        if isinstance(outcome, BaseException):
            failed += 1
            print(f"request {i}: error: {outcome}")
        else:
            latency, text = outcome
            print(f"request {i}: {latency * 1000:.1f} ms {text!r}")
    done = args.num_requests - failed
    print(f"{done}/{args.num_requests} requests in {wall:.2f} s: {done / wall:.2f} requests/s")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt", nargs="?", default="The capital of France is")
    p.add_argument("--url", default="127.0.0.1:8001", help="Triton gRPC endpoint host:port")
    p.add_argument("--model", default="llm_bls", help="llm_bls (unary) or llm (one stream per request)")
    p.add_argument("--stream", action="store_true", help="use a gRPC stream per request for another decoupled model")
    p.add_argument("-n", "--num-requests", type=int, default=8, help="all sent at once")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    args = p.parse_args(argv)
    try:
        return asyncio.run(run(args))
    except InferenceServerException as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
