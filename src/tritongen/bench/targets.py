"""Where `bench serve` sends requests: one small class per server API.

A target turns a BenchRequest into an async stream of Chunks; the load generator stamps the
time of each chunk. Every request asks for exactly output_len tokens (max_tokens = min_tokens,
ignore_eos, greedy), so lengths do not depend on what the model writes.

  openai       POST /v1/completions, SSE stream (stream_options.include_usage for the token count)
  triton-http  POST /v2/models/<model>/generate_stream, SSE stream
  triton-bls   POST /v2/models/<model>/generate (non-streaming front, default model llm_bls)
  triton-grpc  a pool of gRPC streams (grpc.aio, Triton protobufs), see triton_grpc.py
make_target (bench/target_kinds.py) picks one by name.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import AsyncIterator, Optional

from tritongen.bench.datasets import BenchRequest, prompt_text

@dataclass
class Chunk:
    """One piece of a response."""

    text: str = ""
    num_tokens: Optional[int] = None
    """Tokens in this chunk, when the server says."""
    total_tokens: Optional[int] = None
    """Completion tokens of the whole request, when the server reports them (last chunk)."""

    @property
    def has_output(self) -> bool:
        return bool(self.text) or bool(self.num_tokens)


class TargetError(RuntimeError):
    """The server answered with an error."""


class Target:
    """Base: `streams` says whether chunks arrive as they are generated (else TTFT = latency)."""

    name = "base"
    streams = True

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def stream(self, req: BenchRequest) -> AsyncIterator[Chunk]:
        raise NotImplementedError


def sampling_fields(req: BenchRequest) -> dict:
    """The fixed-length greedy request every target sends (vLLM's names)."""
    return {"max_tokens": req.output_len, "min_tokens": req.output_len, "ignore_eos": True, "temperature": 0.0}


class SSEParser:
    """Server-sent events from network chunks: feed() bytes as they arrive, get whole events' data.

    Lines end only at CR, LF or CRLF (the SSE grammar). httpx's aiter_lines also splits at U+2028,
    U+2029 and U+0085 (str.splitlines), which JSON may carry unescaped inside a string (pydantic
    does): the 7B run lost 2 of 1000 requests to "Unterminated string" that way. Splitting bytes
    keeps a line whole however the network cuts it (CR and LF never occur inside a multi-byte
    UTF-8 character), and only whole lines are decoded.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []  # the `data:` lines of the event being read
        self._after_cr = False  # the last chunk ended in CR: an LF opening the next one belongs to it

    def feed(self, chunk: bytes) -> list[str]:
        """The data of every event completed by this chunk (its `data:` lines joined by LF)."""
        if not chunk:
            return []
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._after_cr = chunk.endswith(b"\r")
        lines = (self._buffer + chunk).replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        self._buffer = lines.pop()
        events = []
        for line in lines:
            event = self._line(line.decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
        return events

    def close(self) -> list[str]:
        """At the end of the body: an event left without its blank line still counts."""
        return self.feed(b"\n\n") if self._buffer or self._data else []

    def _line(self, line: str) -> Optional[str]:
        if not line:  # a blank line dispatches the event
            data, self._data = self._data, []
            return "\n".join(data) if data else None
        field, _, value = line.partition(":")
        if field == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None


async def _sse_data(response) -> AsyncIterator[str]:
    parser = SSEParser()
    async for chunk in response.aiter_bytes():  # decompressed, not decoded
        for data in parser.feed(chunk):
            yield data
    for data in parser.close():
        yield data


async def _sse_events(response) -> AsyncIterator[dict]:
    """JSON payloads of an SSE response's events, until [DONE] or the end."""
    async for data in _sse_data(response):
        data = data.strip()
        if data == "[DONE]":
            return
        if data:
            yield json.loads(data)


async def _raise_for_status(response) -> None:
    if response.status_code != 200:
        body = (await response.aread()).decode(errors="replace")
        raise TargetError(f"HTTP {response.status_code}: {body[:300]}")


class _HttpTarget(Target):
    def __init__(self, url: str, model: Optional[str], tokenizer, concurrency: int, timeout: float) -> None:
        self.url = url.rstrip("/")
        if "://" not in self.url:
            self.url = "http://" + self.url
        self.model = model
        self.tokenizer = tokenizer
        self._limits = (concurrency, timeout)
        self.client = None

    async def start(self) -> None:
        import httpx

        conc, timeout = self._limits
        limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
        self.client = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout, connect=30.0))

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()


class OpenAITarget(_HttpTarget):
    """/v1/completions; token-id prompts are sent as ids (the API takes a list of ints)."""

    name = "openai"

    def __init__(self, *args, stream: bool = True, api_key: Optional[str] = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.streams = stream
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def start(self) -> None:
        await super().start()
        if self.model is None:  # ask the server which model it serves
            r = await self.client.get(f"{self.url}/v1/models", headers=self.headers)
            models = (r.json().get("data") or []) if r.status_code == 200 else []
            self.model = models[0]["id"] if models else "default"

    def payload(self, req: BenchRequest) -> dict:
        body = {"model": self.model, "prompt": req.prompt, "stream": self.streams,
                **sampling_fields(req)}
        if self.streams:
            body["stream_options"] = {"include_usage": True}
        return body

    async def stream(self, req: BenchRequest) -> AsyncIterator[Chunk]:
        url = f"{self.url}/v1/completions"
        if not self.streams:
            r = await self.client.post(url, json=self.payload(req), headers=self.headers)
            await _raise_for_status(r)
            d = r.json()
            yield Chunk(text=d["choices"][0].get("text", ""), total_tokens=(d.get("usage") or {}).get("completion_tokens"))
            return
        async with self.client.stream("POST", url, json=self.payload(req), headers=self.headers) as r:
            await _raise_for_status(r)
            async for event in _sse_events(r):
                if "error" in event:
                    raise TargetError(str(event["error"]))
                usage = event.get("usage") or {}
                text = "".join(c.get("text") or "" for c in event.get("choices") or [])
                yield Chunk(text=text, total_tokens=usage.get("completion_tokens"))


def _triton_fields(req: BenchRequest, tokenizer, stream: bool) -> dict:
    params = sampling_fields(req)
    return {"text_input": prompt_text(req, tokenizer), "stream": stream,
            "sampling_parameters": json.dumps(params), "exclude_input_in_output": True,
            "return_num_output_tokens": True}


def _triton_chunk(event: dict) -> Chunk:
    if "error" in event:
        raise TargetError(str(event["error"]))
    text = event.get("text_output", "")
    if isinstance(text, list):
        text = "".join(text)
    n = event.get("num_output_tokens")
    if isinstance(n, list):
        n = n[0] if n else None
    return Chunk(text=text, num_tokens=n)


class TritonHttpTarget(_HttpTarget):
    """Triton's HTTP generate extension on the decoupled model, streamed (SSE)."""

    name = "triton-http"

    async def stream(self, req: BenchRequest) -> AsyncIterator[Chunk]:
        url = f"{self.url}/v2/models/{self.model or 'llm'}/generate_stream"
        async with self.client.stream("POST", url, json=_triton_fields(req, self.tokenizer, True)) as r:
            await _raise_for_status(r)
            async for event in _sse_events(r):
                yield _triton_chunk(event)


class TritonBlsTarget(_HttpTarget):
    """The non-decoupled front (llm_bls) through HTTP /generate: one response per request."""

    name = "triton-bls"
    streams = False

    async def stream(self, req: BenchRequest) -> AsyncIterator[Chunk]:
        url = f"{self.url}/v2/models/{self.model or 'llm_bls'}/generate"
        r = await self.client.post(url, json=_triton_fields(req, self.tokenizer, False))
        await _raise_for_status(r)
        yield _triton_chunk(r.json())
