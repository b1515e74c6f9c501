"""The triton-grpc target: one bidirectional gRPC stream carries every request of the run.

tritonclient's stream delivers responses to a callback on its own thread; the callback routes each
response by request id to the asyncio queue of the coroutine waiting for it. The end of a request
is the response whose `triton_final_response` parameter is true (enable_empty_final_response).
"""
from __future__ import annotations

import asyncio
import itertools
import json
from typing import AsyncIterator, Optional

from tritongen.bench.datasets import BenchRequest, prompt_text
from tritongen.bench.targets import Chunk, Target, TargetError, sampling_fields

_END = object()


class TritonGrpcTarget(Target):
    name = "triton-grpc"

    def __init__(self, url: str, model: Optional[str], tokenizer, timeout: float) -> None:
        self.url = url.split("://", 1)[-1]
        self.model = model or "llm"
        self.tokenizer = tokenizer
        self.timeout = timeout
        self.client = None
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._ids = itertools.count()

    async def start(self) -> None:
        import tritonclient.grpc as grpcclient

        self.client = grpcclient.InferenceServerClient(self.url)
        self.client.start_stream(callback=self._on_response, stream_timeout=None)

    async def close(self) -> None:
        if self.client is not None:
            self.client.stop_stream(cancel_requests=True)
            self.client.close()

    def _on_response(self, result, error) -> None:
        """tritonclient's stream callback (it passes these two parameters by name)."""
        if error is not None and result is None:
            # An error without a request id (stream broken): fail every waiting request.
            for loop, q in list(self._queues.values()):
                loop.call_soon_threadsafe(q.put_nowait, TargetError(str(error)))
            return
        response = result.get_response()
        entry = self._queues.get(response.id)
        if entry is None:
            return
        loop, q = entry
        if error is not None:
            loop.call_soon_threadsafe(q.put_nowait, TargetError(str(error)))
            return
        final = response.parameters.get("triton_final_response")
        text = result.as_numpy("text_output") if _has_output(response, "text_output") else None
        count = result.as_numpy("num_output_tokens") if _has_output(response, "num_output_tokens") else None
        chunk = Chunk(text="".join(_to_str(t) for t in text.reshape(-1)) if text is not None else "",
                      num_tokens=int(count.reshape(-1)[0]) if count is not None else None)
        loop.call_soon_threadsafe(q.put_nowait, chunk)
        if final is not None and final.bool_param:
            loop.call_soon_threadsafe(q.put_nowait, _END)

    def _inputs(self, req: BenchRequest) -> list:
        import numpy as np
        import tritonclient.grpc as grpcclient

        def tensor(name: str, value, dtype: str, np_dtype):
            t = grpcclient.InferInput(name, [1], dtype)
            t.set_data_from_numpy(np.array([value], dtype=np_dtype))
            return t

        return [
            tensor("text_input", prompt_text(req, self.tokenizer).encode(), "BYTES", np.object_),
            tensor("stream", True, "BOOL", bool),
            tensor("sampling_parameters", json.dumps(sampling_fields(req)).encode(), "BYTES", np.object_),
            tensor("exclude_input_in_output", True, "BOOL", bool),
            tensor("return_num_output_tokens", True, "BOOL", bool),
        ]

    async def stream(self, req: BenchRequest) -> AsyncIterator[Chunk]:
        rid = f"bench-{next(self._ids)}"
        q: asyncio.Queue = asyncio.Queue()
        self._queues[rid] = (asyncio.get_running_loop(), q)
        try:
            self.client.async_stream_infer(self.model, self._inputs(req), request_id=rid,
                                           enable_empty_final_response=True)
            while True:
                item = await q.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._queues.pop(rid, None)


def _has_output(response, name: str) -> bool:
    return any(o.name == name for o in response.outputs)


def _to_str(value) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
