"""AsyncLLM: the engine loop in a background thread, requests as async iterators of deltas.

Threading model: the engine thread alone touches EngineCore state. Callers validate and
tokenize in their own thread (read-only work), then post commands (add / abort) to a queue that
the engine thread drains between steps. Outputs go back to each caller's asyncio loop in one
call_soon_threadsafe per step.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import AsyncIterator, Optional, Union

from tritongen.config import EngineConfig
from tritongen.core.engine import EngineCore
from tritongen.types import RequestOutput, SamplingParams, merge_outputs

logger = logging.getLogger(__name__)

# After this many failed steps in a row the engine is declared dead (UNAVAILABLE).
_MAX_CONSECUTIVE_FAILURES = 3


class EngineDeadError(RuntimeError):
    """The engine loop has stopped; no request can be served."""


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


@dataclass
class _Add:
    request_id: str
    token_ids: list[int]
    params: SamplingParams
    prompt: Optional[str]


@dataclass
class _Abort:
    request_id: str
    done: Optional[threading.Event] = None


class AsyncLLM:
    def __init__(self, model: Optional[str] = None, *, engine: Optional[EngineCore] = None, **kwargs) -> None:
        if engine is None:
            from tritongen.entrypoints.llm import create_engine

            engine = create_engine(EngineConfig.from_kwargs(model=model, **kwargs))
        self.engine = engine
        self._commands: "queue.Queue[object]" = queue.Queue()
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()  # guards _streams across the caller and engine threads
        self._ids = itertools.count()
        self._stats = engine.stats()
        self._dead: Optional[BaseException] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tritongen-engine", daemon=True)
        self._thread.start()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.limits.max_model_len

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and self._dead is None

    def stats(self) -> dict:
        """Snapshot taken by the engine thread after its last step."""
        return dict(self._stats)

    # -- caller side --------------------------------------------------------------------------

    def _check_alive(self) -> None:
        if self._dead is not None or not self._thread.is_alive():
            raise EngineDeadError(f"engine is not running: {self._dead!r}")

    def validate(self, prompt: Union[str, list[int]], params: SamplingParams) -> list[int]:
        """Check a request the way add_request will, in the caller's thread; returns token ids."""
        return self.engine.validate(prompt, params)

    async def generate(
        self,
        prompt: Union[str, list[int]],
        params: Optional[SamplingParams] = None,
        request_id: Optional[str] = None,
    ) -> AsyncIterator[RequestOutput]:
        """Yield one RequestOutput per engine step that produced something; the last is finished.
        A caller that falls behind gets the steps it has not read yet merged into one output (their
        deltas joined), so a slow consumer costs one wake-up, not one per step.

        Raises ValueError for bad input before anything is queued. Leaving the loop early (break,
        cancellation, client disconnect) aborts the request.
        """
        self._check_alive()
        params = params or SamplingParams()
        ids = self.validate(prompt, params)
        request_id = request_id or f"req-{next(self._ids)}"
        stream = _Stream(asyncio.get_running_loop())
        with self._lock:
            if request_id in self._streams:
                raise ValueError(f"request_id {request_id!r} is already in use")
            self._streams[request_id] = stream
        self._commands.put(_Add(request_id, ids, params, prompt if isinstance(prompt, str) else None))
        finished = False
        deferred: Optional[BaseException] = None
        try:
            while True:
                item = deferred or await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                while not item.finished and not stream.queue.empty():  # the caller fell behind
                    later = stream.queue.get_nowait()
                    if isinstance(later, BaseException):
                        deferred = later
                        break
                    item = merge_outputs(item, later)
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            with self._lock:
                self._streams.pop(request_id, None)
            if not finished:
                self._commands.put(_Abort(request_id))

    async def abort(self, request_id: str) -> None:
        """Abort a request; when this returns its KV blocks are free."""
        done = threading.Event()
        self._commands.put(_Abort(request_id, done))
        if self._thread.is_alive():
            await asyncio.get_running_loop().run_in_executor(None, done.wait, 5.0)

    def shutdown(self) -> None:
        self._stop.set()
        self._commands.put(None)
        self._thread.join(timeout=10)
        self.engine.shutdown()

    # -- engine thread ------------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            if not self._drain_commands(block=not self.engine.has_unfinished()):
                break
            if not self.engine.has_unfinished():
                continue
            try:
                outputs = self.engine.step()
                failures = 0
            except Exception as exc:
                logger.exception("engine step failed")
                failures += 1
                outputs = self.engine.fail_all(exc)
                if failures >= _MAX_CONSECUTIVE_FAILURES or getattr(exc, "fatal", False):
                    self._dead = exc
            self._stats = self.engine.stats()
            self._dispatch(outputs)
            if self._dead is not None:
                self._fail_streams(EngineDeadError(f"engine stopped after repeated failures: {self._dead!r}"))
                return

    def _drain_commands(self, block: bool) -> bool:
        """Apply queued adds and aborts; False when asked to stop."""
        try:
            cmd = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if cmd is None:
                return False
            self._apply(cmd)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _apply(self, cmd: object) -> None:
        if isinstance(cmd, _Add):
            with self._lock:
                wanted = cmd.request_id in self._streams
            if not wanted:
                return  # the caller left before the request reached the engine
            try:
                self.engine.add_request(cmd.request_id, cmd.token_ids, cmd.params, cmd.prompt)
            except Exception as exc:
                self._deliver(cmd.request_id, ValueError(str(exc)))
        elif isinstance(cmd, _Abort):
            out = self.engine.abort(cmd.request_id)
            if out is not None:
                self._stats = self.engine.stats()
            if cmd.done is not None:
                cmd.done.set()

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, RequestOutput]]] = {}
        with self._lock:
            for out in outputs:
                stream = self._streams.get(out.request_id)
                if stream is not None:
                    by_loop.setdefault(stream.loop, []).append((stream.queue, out))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:
                pass  # that caller's loop is closed

    def _deliver(self, request_id: str, item: object) -> None:
        with self._lock:
            stream = self._streams.get(request_id)
        if stream is not None:
            try:
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)
            except RuntimeError:
                pass

    def _fail_streams(self, exc: BaseException) -> None:
        with self._lock:
            ids = list(self._streams)
        for rid in ids:
            self._deliver(rid, exc)


def _put_all(items: list[tuple[asyncio.Queue, RequestOutput]]) -> None:
    for q, out in items:
        q.put_nowait(out)
