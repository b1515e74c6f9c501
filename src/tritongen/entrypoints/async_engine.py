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
from typing import AsyncIterator, Callable, Optional, Union

from tritongen.config import EngineConfig
from tritongen.core.engine import EngineCore
from tritongen.entrypoints.engine_process import OutputAccumulator, RemoteEngine
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


def wants_engine_process(device: Optional[str]) -> bool:
    """engine_process unset: a child process when the engine will run on CUDA. Only asks whether
    CUDA exists (no context is created here; the child creates its own)."""
    device = device or "auto"
    if device == "auto":
        import torch

        return torch.cuda.is_available()
    return device.startswith("cuda")


@dataclass
class _Abort:
    request_id: str
    done: Optional[threading.Event] = None


class AsyncLLM:
    def __init__(self, model: Optional[str] = None, *, engine: Optional[EngineCore] = None, **kwargs) -> None:
        """kwargs are engine options; engine_process=True runs the engine loop in a child process
        (entrypoints/engine_process.py) instead of a thread of this one, so that the caller's
        per-token work and the engine's host work do not share a GIL."""
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()  # guards _streams across the caller and engine threads
        self._ids = itertools.count()
        self._dead: Optional[BaseException] = None
        self._stop = threading.Event()
        if kwargs.get("engine_process") is None:
            kwargs["engine_process"] = engine is None and wants_engine_process(kwargs.get("device", "auto"))
        if kwargs["engine_process"]:
            if engine is not None:
                raise ValueError("engine_process=True builds its own engine; do not pass one")
            self.engine = RemoteEngine({"model": model, **kwargs})
            self._stats = self.engine.initial_stats
            self._commands = _Forwarder(self.engine)
            self._thread = threading.Thread(target=self._run_remote, name="tritongen-engine-reader", daemon=True)
        else:
            if engine is None:
                from tritongen.entrypoints.llm import create_engine

                engine = create_engine(EngineConfig.from_kwargs(model=model, **kwargs))
            self.engine = engine
            self._commands = queue.Queue()
            self._stats = engine.stats()
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
        run_engine_loop(self.engine, self._drain_commands, self._deliver_step, self._died)

    def _deliver_step(self, outputs: list[RequestOutput], stats: dict) -> None:
        self._stats = stats
        self._dispatch(outputs)

    def _died(self, exc: BaseException, why: str = "engine stopped after repeated failures") -> None:
        self._dead = exc
        self._fail_streams(EngineDeadError(f"{why}: {exc!r}"))

    def _run_remote(self) -> None:
        """engine_process: read the child's messages until it exits (its socket closes)."""
        forward: _Forwarder = self._commands
        while True:
            try:
                msg = self.engine.conn.recv()
            except (EOFError, OSError):
                if not self._stop.is_set():
                    code = self.engine.exit_code(timeout=5)
                    self._died(RuntimeError(f"the engine process exited with code {code}"), "engine process exited")
                return
            kind = msg[0]
            if kind == "step":
                self._stats = msg[2]
                self._dispatch(forward.outputs(msg[1]))
            elif kind == "rejected":
                forward.accumulators.pop(msg[1], None)
                self._deliver(msg[1], ValueError(msg[2]))
            elif kind == "aborted":
                done = forward.acks.pop(msg[1], None)
                if done is not None:
                    done.set()
            elif kind == "dead":
                self._died(RuntimeError(msg[1]))
                return

    def _drain_commands(self, block: bool) -> bool:
        """Apply queued adds and aborts; False when asked to stop."""
        if self._stop.is_set():
            return False
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


def run_engine_loop(engine, drain: Callable[[bool], bool], deliver: Callable[[list[RequestOutput], dict], None],
                    died: Callable[[BaseException], None]) -> None:
    """The engine loop (a thread of AsyncLLM, or the engine process): apply commands (waiting for
    one when idle), step, hand the outputs on; stop when drain() says so or after repeated failures."""
    failures = 0
    while True:
        if not drain(not engine.has_unfinished()):
            return
        if not engine.has_unfinished():
            continue
        dead: Optional[BaseException] = None
        try:
            outputs = engine.step()
            failures = 0
        except Exception as exc:
            logger.exception("engine step failed")
            failures += 1
            outputs = engine.fail_all(exc)
            if failures >= _MAX_CONSECUTIVE_FAILURES or getattr(exc, "fatal", False):
                dead = exc
        deliver(outputs, engine.stats())
        if dead is not None:
            died(dead)
            return


class _Forwarder:
    """AsyncLLM's command queue with the engine in a child process: put() sends each command at
    once; the accumulators rebuild each request's outputs from the child's deltas."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.accumulators: dict[str, OutputAccumulator] = {}
        self.acks: dict[int, threading.Event] = {}
        self._tokens = itertools.count()

    def put(self, cmd: object) -> None:
        try:
            if isinstance(cmd, _Add):
                self.accumulators[cmd.request_id] = OutputAccumulator(cmd.request_id, cmd.token_ids, cmd.prompt)
                self.engine.send(("add", cmd.request_id, cmd.token_ids, cmd.params, cmd.prompt))
            elif isinstance(cmd, _Abort):
                token = next(self._tokens)
                if cmd.done is not None:
                    self.acks[token] = cmd.done
                self.engine.send(("abort", cmd.request_id, token))
            elif cmd is None:
                self.engine.send(("stop",))
        except OSError as exc:  # the engine process is gone; the reader reports it to every stream
            if isinstance(cmd, _Add):
                raise EngineDeadError(f"the engine process is gone: {exc}") from exc
            if isinstance(cmd, _Abort) and cmd.done is not None:
                cmd.done.set()  # nothing left to abort

    def outputs(self, deltas: list) -> list[RequestOutput]:
        outs = []
        for d in deltas:
            acc = self.accumulators.get(d.request_id)
            if acc is None:
                continue  # rejected, or already finished
            outs.append(acc.apply(d))
            if d.finish_reason is not None:
                del self.accumulators[d.request_id]
        return outs


def _put_all(items: list[tuple[asyncio.Queue, RequestOutput]]) -> None:
    for q, out in items:
        q.put_nowait(out)
