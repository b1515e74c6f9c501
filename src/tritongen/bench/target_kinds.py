"""The kinds of `bench serve` target by name, and make_target, which builds one (bench/targets.py
and bench/triton_grpc.py hold the classes)."""
from __future__ import annotations

from typing import Optional

from tritongen.bench.targets import OpenAITarget, Target, TritonBlsTarget, TritonHttpTarget
from tritongen.bench.triton_grpc import TritonGrpcTarget

TARGETS = ("openai", "triton-grpc", "triton-http", "triton-bls")
DEFAULT_URLS = {
    "openai": "http://127.0.0.1:9000",
    "triton-grpc": "127.0.0.1:8001",
    "triton-http": "http://127.0.0.1:8000",
    "triton-bls": "http://127.0.0.1:8000",
}


def make_target(kind: str, url: Optional[str], model: Optional[str], tokenizer, concurrency: int,
                timeout: float, stream: bool = True, api_key: Optional[str] = None,
                grpc_streams: Optional[int] = None) -> Target:
    url = url or DEFAULT_URLS.get(kind, "")
    if kind == "openai":
        return OpenAITarget(url, model, tokenizer, concurrency, timeout, stream=stream, api_key=api_key)
    if kind == "triton-http":
        return TritonHttpTarget(url, model, tokenizer, concurrency, timeout)
    if kind == "triton-bls":
        return TritonBlsTarget(url, model, tokenizer, concurrency, timeout)
    if kind == "triton-grpc":
        return TritonGrpcTarget(url, model, tokenizer, timeout, concurrency=concurrency, num_streams=grpc_streams)
    raise ValueError(f"unknown target {kind!r}; choose from {', '.join(TARGETS)}")
