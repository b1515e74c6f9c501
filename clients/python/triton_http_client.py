#!/usr/bin/env python3
"""One synchronous generation from tritongen's non-decoupled `llm_bls` model over HTTP
(pip install tritonclient[http]).

    python clients/python/triton_http_client.py --url 127.0.0.1:8000 --max-tokens 16 "The capital of France is"

Asks twice, the two ways a plain HTTP client can: POST /v2/models/llm_bls/generate (JSON in,
JSON out) and POST /v2/models/llm_bls/infer (KServe v2 tensors, through tritonclient.http).
Prints each answer. The text goes to the model as it is (no chat template): give it a prompt to
continue.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

try:
    import numpy as np
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException
except ImportError as exc:  # one line, not a traceback
    sys.exit(f"{exc.name} is missing: pip install 'tritonclient[http]' "
             "(or tritongen's extra: pip install -e '.[clients]')")


def via_generate(url: str, model: str, prompt: str, sampling: dict, timeout: float) -> str:
    body = {"text_input": prompt, "exclude_input_in_output": True, "sampling_parameters": json.dumps(sampling)}
    request = urllib.request.Request(f"http://{url}/v2/models/{model}/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())["text_output"]
    except urllib.error.HTTPError as exc:  # Triton answers errors as {"error": "..."}
        raise RuntimeError(f"HTTP {exc.code}: {exc.read().decode(errors='replace')}") from None


def via_infer(url: str, model: str, prompt: str, sampling: dict, timeout: float) -> str:
    tensors = {"text_input": np.array([prompt.encode("utf-8")], dtype=np.object_),
               "exclude_input_in_output": np.array([True]),
               "sampling_parameters": np.array([json.dumps(sampling).encode("utf-8")], dtype=np.object_)}
    inputs = []
    for name, arr in tensors.items():
        tensor = httpclient.InferInput(name, list(arr.shape), "BOOL" if arr.dtype == np.bool_ else "BYTES")
        tensor.set_data_from_numpy(arr, binary_data=False)
        inputs.append(tensor)
    client = httpclient.InferenceServerClient(url, network_timeout=timeout, connection_timeout=timeout)
    try:
        result = client.infer(model, inputs, outputs=[httpclient.InferRequestedOutput("text_output",
                                                                                      binary_data=False)])
    finally:
        client.close()
    value = result.as_numpy("text_output").reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt", nargs="?", default="The capital of France is")
    p.add_argument("--url", default="127.0.0.1:8000", help="Triton HTTP endpoint host:port")
    p.add_argument("--model", default="llm_bls", help="a non-decoupled model")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each answer")
    args = p.parse_args(argv)

    sampling = {"max_tokens": args.max_tokens, "temperature": args.temperature, "ignore_eos": args.ignore_eos}
    for label, ask in (("generate", via_generate), ("infer", via_infer)):
        start = time.perf_counter()
        try:
            answer = ask(args.url, args.model, args.prompt, sampling, args.timeout)
        except (InferenceServerException, RuntimeError, OSError) as exc:
            print(f"{label}: error: {exc}", file=sys.stderr)
            return 1
        print(f"{label} ({(time.perf_counter() - start) * 1000:.1f} ms): {answer}")
        if not answer:
            print(f"{label}: no text generated (the model ended at once); the prompt is sent without a chat "
                  "template: try one to continue, e.g. \"The capital of France is\"", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
