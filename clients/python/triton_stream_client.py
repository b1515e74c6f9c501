#!/usr/bin/env python3
"""Stream one generation from tritongen's decoupled `llm` model over gRPC (pip install tritonclient[grpc]).

    python clients/python/triton_stream_client.py --url 127.0.0.1:8001 --max-tokens 16 "The capital of France is"

Sends text_input + stream=true + sampling_parameters (JSON, vllm_backend layout), prints the text
as it arrives, then the time to first token (TTFT) and the total time. The text goes to the model
as it is (no chat template), so give it a prompt to continue: an instruct model asked a bare question
("What is the capital of France?") may end at once with no text, and then no TTFT is printed.
"""
from __future__ import annotations

import argparse
import json
import queue
import sys
import time

try:
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException
except ImportError as exc:  # one line, not a traceback
    sys.exit(f"{exc.name} is missing: pip install 'tritonclient[grpc]' "
             "(or tritongen's extra: pip install -e '.[clients]')")


def make_inputs(prompt: str, sampling: dict) -> list:
    tensors = {"text_input": np.array([prompt.encode("utf-8")], dtype=np.object_),
               "stream": np.array([True]),
               "sampling_parameters": np.array([json.dumps(sampling).encode("utf-8")], dtype=np.object_)}
    inputs = []
    for name, arr in tensors.items():
        tensor = grpcclient.InferInput(name, list(arr.shape), "BOOL" if arr.dtype == np.bool_ else "BYTES")
        tensor.set_data_from_numpy(arr)
        inputs.append(tensor)
    return inputs


def stream(url: str, model: str, prompt: str, sampling: dict, timeout: float) -> tuple[float | None, float, int]:
    """Print the deltas of one streamed request; return (TTFT s, total s, number of text responses).
    TTFT is None when no text came: a time to first token needs a token."""
    responses: "queue.Queue" = queue.Queue()

    def callback(result, error):  # tritonclient calls it by these exact parameter names
        responses.put((result, error))

    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=callback)
    try:
        start = time.perf_counter()
        # The empty FINAL response tells us the request is over (tokens may all be sent before it).
        client.async_stream_infer(model, make_inputs(prompt, sampling), enable_empty_final_response=True)
        ttft, count = None, 0
        while True:
            result, error = responses.get(timeout=timeout)
            if error is not None:
                raise error
            response = result.get_response()
            if response.outputs:
                delta = b"".join(result.as_numpy("text_output").reshape(-1)).decode("utf-8")
                if delta and ttft is None:
                    ttft = time.perf_counter() - start
                count += bool(delta)
                print(delta, end="", flush=True)
            if response.parameters["triton_final_response"].bool_param:
                break
        total = time.perf_counter() - start
        return ttft, total, count
    finally:
        client.stop_stream()
        client.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt", nargs="?", default="The capital of France is")
    p.add_argument("--url", default="127.0.0.1:8001", help="Triton gRPC endpoint host:port")
    p.add_argument("--model", default="llm", help="the decoupled engine model")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each response")
    args = p.parse_args(argv)

    sampling = {"max_tokens": args.max_tokens, "temperature": args.temperature, "ignore_eos": args.ignore_eos}
    try:
        ttft, total, count = stream(args.url, args.model, args.prompt, sampling, args.timeout)
    except (InferenceServerException, queue.Empty) as exc:
        print(f"\nerror: {exc or 'no response within --timeout'}", file=sys.stderr)
        return 1
    if ttft is None:
        print(f"\nno text generated (the model ended at once); total: {total * 1000:.1f} ms")
        print("hint: the prompt is sent without a chat template: try one to continue, e.g. "
              "\"The capital of France is\"", file=sys.stderr)
        return 0
    print(f"\nTTFT: {ttft * 1000:.1f} ms")
    print(f"total: {total * 1000:.1f} ms, {count} text responses")
    return 0


if __name__ == "__main__":
    sys.exit(main())
