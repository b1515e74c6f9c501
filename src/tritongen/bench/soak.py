"""Reliability soak against running servers: the malformed-input corpus and a cancel storm.

- `check_corpus`: sends every case of bench/malformed.py and checks the answer is a client error
  naming the problem, quickly, and that the server still answers a good request afterwards.
- `cancel_storm`: many greedy requests at once over every client path, a fraction of them
  cancelled at a random moment (gRPC stream cancel, gRPC unary cancel, HTTP disconnect, SSE
  disconnect). Every request must end (no hang), every completed one must equal the answer its
  prompt gets alone (no response reaches the wrong request), and afterwards the server must hold
  no running request and no KV block (the `tritongen_*` gauges).
"""
from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from tritongen.bench.malformed import Case, grpc_arrays, http_infer_body

REQUEST_TIMEOUT_S = 60.0
"""A request that has not ended after this long counts as a hang."""
PROMPTS = [f"Story {i}: once upon a time" for i in range(8)]


@dataclass
class Urls:
    http: Optional[str] = None
    """Triton HTTP host:port."""
    grpc: Optional[str] = None
    """Triton gRPC host:port."""
    metrics: Optional[str] = None
    """Triton metrics URL (http://host:port/metrics)."""
    openai: Optional[str] = None
    """OpenAI server base URL (http://host:port)."""
    openai_model: str = ""


@dataclass
class Answer:
    kind: str
    """"ok", "client_error" (HTTP 4xx / INVALID_ARG), "server_error", "cancelled", "hang"."""
    message: str = ""
    text: str = ""
    seconds: float = 0.0


# -- one request on each path -----------------------------------------------------------------


def _http_kind(status: int) -> str:
    return "ok" if status == 200 else "client_error" if 400 <= status < 500 else "server_error"


async def _http(client, url: str, body: dict) -> Answer:
    # json.dumps escapes lone surrogates (a hostile prompt may hold one); httpx's json= cannot encode them
    resp = await client.post(url, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        payload = resp.json()
    except ValueError:
        payload = {"error": resp.text}
    error = payload.get("error") if isinstance(payload, dict) else None
    message = error.get("message", "") if isinstance(error, dict) else str(error or "")
    text = payload.get("text_output", "") if isinstance(payload, dict) else ""
    if isinstance(payload, dict) and "choices" in payload:
        choice = payload["choices"][0]
        text = choice.get("text") or (choice.get("message") or {}).get("content") or ""
    return Answer(_http_kind(resp.status_code), message, text)


async def _sse(client, url: str, body: dict) -> Answer:
    """HTTP generate_stream / OpenAI stream: join the events' text."""
    parts, message = [], ""
    async with client.stream("POST", url, content=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"}) as resp:
        if resp.status_code != 200:
            raw = await resp.aread()
            return Answer(_http_kind(resp.status_code), raw.decode("utf-8", "replace"))
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                message = str(event["error"])
                break
            if "choices" in event:
                parts.extend(c.get("text") or (c.get("delta") or {}).get("content") or "" for c in event["choices"])
            else:
                parts.append(event.get("text_output", ""))
    return Answer("server_error" if message else "ok", message, "".join(parts))


def _grpc_inputs(fields: dict):
    import tritonclient.grpc.aio as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    inputs = []
    for name, arr in grpc_arrays(fields).items():
        tensor = grpcclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
        tensor.set_data_from_numpy(arr)
        inputs.append(tensor)
    return inputs


def _grpc_text(result) -> str:
    arr = result.as_numpy("text_output")
    return b"".join(arr.reshape(-1)).decode("utf-8") if arr is not None else ""


async def _grpc_unary(client, model: str, fields: dict) -> Answer:
    from tritonclient.utils import InferenceServerException

    try:
        result = await client.infer(model, _grpc_inputs(fields))
    except InferenceServerException as exc:
        kind = "client_error" if exc.status() == "StatusCode.INVALID_ARGUMENT" else "server_error"
        return Answer(kind, exc.message() or "")
    return Answer("ok", text=_grpc_text(result))


async def _grpc_stream(client, model: str, fields: dict, stream: bool) -> Answer:
    """One request on a stream of its own; in-band errors carry a message but no status code, so
    a client error is told by the engine model's own wording (it names an input)."""
    async def requests():
        yield {"model_name": model, "inputs": _grpc_inputs(fields), "enable_empty_final_response": True}
    parts = []
    async for result, error in client.stream_infer(requests()):
        if error is not None:
            message = error.message() or str(error)
            kind = "server_error" if re.search(r"unavailable|internal|engine|not ready", message, re.I) else \
                "client_error"
            return Answer(kind, message)
        if result.as_numpy("text_output") is not None:
            parts.append(_grpc_text(result))
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    return Answer("ok", text="".join(parts) if stream else (parts[-1] if parts else ""))


# -- the corpus -------------------------------------------------------------------------------


@dataclass
class CorpusReport:
    total: int = 0
    passed: int = 0
    failures: list[str] = field(default_factory=list)
    slowest_s: float = 0.0


async def send_case(case: Case, urls: Urls, http_client, grpc_client) -> Answer:
    if case.front == "triton-generate":
        return await _http(http_client, f"http://{urls.http}/v2/models/{case.model}/generate", case.fields)
    if case.front == "triton-infer":
        return await _http(http_client, f"http://{urls.http}/v2/models/{case.model}/infer",
                           http_infer_body(case.fields))
    if case.front == "triton-grpc-unary":
        return await _grpc_unary(grpc_client, case.model, case.fields)
    if case.front == "triton-grpc-stream":
        return await _grpc_stream(grpc_client, case.model, case.fields, stream=False)
    if case.front == "openai":
        return await _http(http_client, f"{urls.openai}{case.path}", case.fields)
    raise ValueError(f"unknown front {case.front!r}")


async def check_corpus(cases: list[Case], urls: Urls, concurrency: int = 8) -> CorpusReport:
    """Send every case (a few at a time); each must be a client error naming its problem."""
    import httpx

    report = CorpusReport(total=len(cases))
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as http_client, _grpc_client(urls) as grpc_client:
        async def one(case: Case) -> None:
            async with sem:
                start = time.monotonic()
                try:
                    answer = await asyncio.wait_for(send_case(case, urls, http_client, grpc_client),
                                                    REQUEST_TIMEOUT_S)
                except asyncio.TimeoutError:
                    answer = Answer("hang")
                except Exception as exc:  # a dropped connection is a failure of the case, not of the run
                    answer = Answer("transport_error", f"{type(exc).__name__}: {exc}")
                seconds = time.monotonic() - start
                report.slowest_s = max(report.slowest_s, seconds)
                if answer.kind == "client_error" and case.needle.lower() in answer.message.lower():
                    report.passed += 1
                else:
                    report.failures.append(f"{case.front} {case.model}{case.path} [{case.name}]: {answer.kind} "
                                           f"{answer.message[:160]!r}")
        await asyncio.gather(*(one(c) for c in cases))
    return report


class _grpc_client:
    """tritonclient's aio client as an async context manager (None without a gRPC URL)."""

    def __init__(self, urls: Urls) -> None:
        self.url, self.client = urls.grpc, None

    async def __aenter__(self):
        if self.url:
            import tritonclient.grpc.aio as grpcclient

            self.client = grpcclient.InferenceServerClient(self.url)
        return self.client

    async def __aexit__(self, *exc) -> None:
        if self.client is not None:
            await self.client.close()


# -- the cancel storm -------------------------------------------------------------------------

PATHS = ("triton-grpc-stream", "triton-grpc-unary", "triton-sse", "triton-generate", "openai", "openai-sse")


@dataclass
class StormReport:
    sent: int = 0
    cancelled: int = 0
    completed: int = 0
    mismatched: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    hangs: int = 0
    by_path: Counter = field(default_factory=Counter)
    seconds: float = 0.0


async def _send_path(path: str, prompt: str, max_tokens: int, urls: Urls, http_client, grpc_client) -> Answer:
    fields = {"text_input": prompt, "max_tokens": max_tokens,
              "sampling_parameters": json.dumps({"temperature": 0, "ignore_eos": True})}
    if path == "triton-grpc-stream":
        return await _grpc_stream(grpc_client, "llm", fields, stream=False)
    if path == "triton-grpc-unary":
        return await _grpc_unary(grpc_client, "llm_bls", fields)
    if path == "triton-sse":
        return await _sse(http_client, f"http://{urls.http}/v2/models/llm/generate_stream", {**fields, "stream": True})
    if path == "triton-generate":
        return await _http(http_client, f"http://{urls.http}/v2/models/llm_bls/generate", fields)
    body = {"model": urls.openai_model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    if path == "openai":
        return await _http(http_client, f"{urls.openai}/v1/completions", body)
    return await _sse(http_client, f"{urls.openai}/v1/completions", {**body, "stream": True})


def _strip_echo(path: str, prompt: str, text: str) -> str:
    """Triton's text paths echo the prompt in non-streamed text unless excluded (vllm_backend)."""
    return text[len(prompt):] if path in ("triton-grpc-stream", "triton-grpc-unary", "triton-generate") \
        and text.startswith(prompt) else text


async def references(paths: tuple[str, ...], urls: Urls, max_tokens: int) -> dict[tuple[str, str], str]:
    """Each prompt's greedy answer on each path, sent alone."""
    import httpx

    refs = {}
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as http_client, _grpc_client(urls) as grpc_client:
        for path in paths:
            for prompt in PROMPTS:
                answer = await _send_path(path, prompt, max_tokens, urls, http_client, grpc_client)
                if answer.kind != "ok":
                    raise RuntimeError(f"reference on {path} failed: {answer.kind} {answer.message}")
                refs[(path, prompt)] = _strip_echo(path, prompt, answer.text)
    return refs


async def cancel_storm(urls: Urls, paths: tuple[str, ...], num_requests: int, concurrency: int = 32,
                       cancel_fraction: float = 0.3, max_tokens: int = 12, seed: int = 0,
                       max_cancel_delay_s: float = 1.0) -> StormReport:
    """num_requests greedy requests, `concurrency` at a time, spread over `paths`; a random
    `cancel_fraction` of them cancelled after a random delay in [0, max_cancel_delay_s)."""
    import httpx

    refs = await references(paths, urls, max_tokens)
    rng = random.Random(seed)
    plan = [(rng.choice(paths), rng.choice(PROMPTS), rng.random() < cancel_fraction,
             rng.random() * max_cancel_delay_s) for _ in range(num_requests)]
    report = StormReport(sent=num_requests)
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency * 2)
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as http_client, \
            _grpc_client(urls) as grpc_client:
        async def one(path: str, prompt: str, cancel: bool, delay: float) -> None:
            async with sem:
                report.by_path[path] += 1
                task = asyncio.ensure_future(_send_path(path, prompt, max_tokens, urls, http_client, grpc_client))
                done, _ = await asyncio.wait([task], timeout=delay if cancel else REQUEST_TIMEOUT_S)
                if not done and cancel:
                    task.cancel()
                    report.cancelled += 1
                    await asyncio.gather(task, return_exceptions=True)
                    return
                if not done:
                    report.hangs += 1
                    task.cancel()
                    return
                _record(report, path, prompt, task, refs)
        await asyncio.gather(*(one(*p) for p in plan))
    report.seconds = time.monotonic() - start
    return report


def _record(report: StormReport, path: str, prompt: str, task: asyncio.Task, refs: dict) -> None:
    exc = task.exception()
    if exc is not None:
        report.errors.append(f"{path}: {type(exc).__name__}: {exc}")
        return
    answer = task.result()
    if answer.kind != "ok":
        report.errors.append(f"{path}: {answer.kind} {answer.message[:160]}")
        return
    report.completed += 1
    if _strip_echo(path, prompt, answer.text) != refs[(path, prompt)]:
        report.mismatched.append(f"{path} {prompt!r}: {answer.text[:80]!r}")


# -- server state -----------------------------------------------------------------------------


def gauges(metrics_url: str) -> dict[str, float]:
    """tritongen_* gauges summed over their label sets (one model here)."""
    import urllib.request

    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        body = resp.read().decode()
    values: dict[str, float] = {}
    for name in ("tritongen_num_requests_running", "tritongen_num_requests_waiting", "tritongen_kv_cache_usage_ratio"):
        found = re.findall(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", body, re.M)
        values[name] = sum(float(v) for v in found) if found else float("nan")
    return values


def wait_idle(metrics_url: str, timeout: float = 30.0) -> dict[str, float]:
    """Poll the gauges until nothing runs, waits or holds a KV block; returns the last reading."""
    deadline = time.monotonic() + timeout
    while True:
        values = gauges(metrics_url)
        if all(v == 0 for v in values.values()) or time.monotonic() > deadline:
            return values
        time.sleep(0.25)
