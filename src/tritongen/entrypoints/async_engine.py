"""AsyncLLM: the engine loop in a background thread, requests as async iterators of deltas.

Threading model: the engine thread alone touches EngineCore state. Callers validate and
tokenize in their own thread (read-only work), then post commands (add / abort) to a queue that
the engine thread drains between steps. Outputs go back to each caller's asyncio loop in one
call_soon_threadsafe per step, whose callback hands every output of that step to its request:
generate() puts it in the request's queue (its task wakes up to read it); open() calls the
consumer's function at once, so a front serving many streams (the Triton `llm` model) handles a
whole step in that one callback, without waking a task per request.

Failures (entrypoints/engine_loop.py): a step that raises fails only its own requests. When the
engine is given up (steps failing in a row, a fatal error) or its process dies, every request in
flight ends at once with EngineDeadError, new ones get it too, `is_running` is False, and the
engine is rebuilt from its options — in this process, or by spawning a new engine process —
after which it serves again (`stats()["engine_restarts"]` counts these).
"""
from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import queue
import sys
import threading
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Optional, Union

from tritongen.config import EngineConfig
from tritongen.core.engine import EngineCore
from tritongen.entrypoints.engine_loop import rebuild, run_engine_loop
from tritongen.entrypoints.engine_process import (AbortRequest, AddRequest, Delta, OutputAccumulator, RemoteEngine,
                                                  StopEngine)
from tritongen.types import RequestOutput, SamplingParams, merge_outputs

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine is down (restarting, or shut down): this request cannot be served now. Fronts
    answer UNAVAILABLE / 503; requests sent once `is_running` is True again are served."""


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    put: Callable[[object], None]
    """Called on `loop` with each output of the request (one per step) or the exception ending it."""


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
        per-token work and the engine's host work do not share a GIL. An `engine` handed in is
        not rebuilt after a failure: it stays down (one built from options restarts)."""
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()  # guards _streams and _dead across the caller and engine threads
        self._ids = itertools.count()
        self._dead: Optional[BaseException] = None
        """Why the engine is down (restarting or shut down); None while it serves."""
        self._stop = threading.Event()
        self.restarts = 0
        """Times the engine was rebuilt (in this process, or as a new engine process)."""
        if kwargs.get("engine_process") is None:
            kwargs["engine_process"] = engine is None and wants_engine_process(kwargs.get("device", "auto"))
        if kwargs["engine_process"]:
            if engine is not None:
                raise ValueError("engine_process=True builds its own engine; do not pass one")
            self._engine_kwargs = {"model": model, **kwargs}
            self.engine = RemoteEngine(self._engine_kwargs)
            self._stats = self.engine.initial_stats
            self._commands = _Forwarder(self.engine)
            self._thread = threading.Thread(target=self._run_remote, name="tritongen-engine-reader", daemon=True)
        else:
            self._build: Optional[Callable[[], EngineCore]] = None
            if engine is None:
                from tritongen.entrypoints.llm import create_engine

                config = EngineConfig.from_kwargs(model=model, **kwargs)
                self._build = lambda: create_engine(config)
                engine = self._build()
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
        """True while requests are served; False while the engine restarts and after shutdown."""
        return self._thread.is_alive() and self._dead is None

    @property
    def engine_pid(self) -> Optional[int]:
        """PID of the engine process (engine_process=True; a new one after each restart), else None."""
        proc = getattr(self.engine, "proc", None)
        return proc.pid if proc is not None else None

    def health(self) -> dict:
        """running (= is_running), restarts, engine_pid, and why the engine is down (None when up)."""
        dead = self._dead
        return {"running": self.is_running, "restarts": self.restarts, "engine_pid": self.engine_pid,
                "error": None if dead is None else f"{type(dead).__name__}: {dead}"}

    def stats(self) -> dict:
        """Snapshot taken by the engine thread after its last step, plus engine_restarts."""
        return dict(self._stats, engine_restarts=self.restarts)

    # -- caller side --------------------------------------------------------------------------

    def _check_alive(self) -> None:
        dead = self._dead
        if dead is not None or not self._thread.is_alive():
            raise EngineDeadError(f"the engine is not running: {dead!r}")

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

        Raises ValueError for bad input before anything is queued, EngineDeadError when the engine
        is down or goes down meanwhile. A request the engine fails ends with finish_reason "error"
        and `error` set. Leaving the loop early (break, cancellation, client disconnect) aborts
        the request.
        """
        self._check_alive()
        params = params or SamplingParams()
        ids = self.validate(prompt, params)
        request_id = request_id or f"req-{next(self._ids)}"
        outputs: asyncio.Queue = asyncio.Queue()
        self._register(request_id, _Stream(asyncio.get_running_loop(), outputs.put_nowait))
        finished = False
        deferred: Optional[BaseException] = None
        try:
            self._commands.put(AddRequest(request_id, ids, params, prompt if isinstance(prompt, str) else None))
            while not finished:
                item = deferred or await outputs.get()
                if isinstance(item, BaseException):
                    raise item
                while not item.finished and not outputs.empty():  # the caller fell behind
                    later = outputs.get_nowait()
                    if isinstance(later, BaseException):
                        deferred = later
                        break
                    item = merge_outputs(item, later)
                finished = item.finished
                yield item
        finally:
            with self._lock:
                self._streams.pop(request_id, None)
            if not finished and self.is_running:
                self._commands.put(_Abort(request_id))

    def open(self, prompt: Union[str, list[int]], params: Optional[SamplingParams], request_id: str,
             on_item: Callable[[object], None]) -> "OutputStream":
        """Start a request whose outputs are handed to `on_item` on the calling thread's running
        loop, with no task per request: the one callback of each engine step calls it for each of
        that step's outputs. `on_item` gets every step's RequestOutput (never merged: the consumer
        coalesces as it sees fit), or the exception ending the request (EngineDeadError, or
        ValueError for a request the engine refused); nothing after a finished output or an
        exception. It runs inside the step's callback: it must not block, and one that raises is
        logged while the step's other requests go on. Raises as generate() does before anything is
        queued. close() the returned stream when done with it: before the end, that aborts the
        request (as leaving generate() early does)."""
        self._check_alive()
        params = params or SamplingParams()
        ids = self.validate(prompt, params)
        stream = OutputStream(self, request_id, on_item)
        self._register(request_id, _Stream(asyncio.get_running_loop(), stream._put))
        self._commands.put(AddRequest(request_id, ids, params, prompt if isinstance(prompt, str) else None))
        return stream

    def _register(self, request_id: str, stream: _Stream) -> None:
        with self._lock:
            self._check_alive()  # under the lock: no stream is added after _went_down ended them
            if request_id in self._streams:
                raise ValueError(f"request_id {request_id!r} is already in use")
            self._streams[request_id] = stream

    def _close(self, request_id: str, put: Callable[[object], None], ended: bool) -> None:
        with self._lock:
            stream = self._streams.get(request_id)
            if stream is not None and stream.put == put:
                del self._streams[request_id]
        if not ended and self.is_running:
            self._commands.put(_Abort(request_id))

    async def abort(self, request_id: str) -> None:
        """Abort a request; when this returns its KV blocks are free. An id the engine does not
        know (finished, never sent, or another AsyncLLM's) is a no-op; never raises."""
        if not self.is_running:
            return  # nothing runs: every request has ended already
        done = threading.Event()
        self._commands.put(_Abort(request_id, done))
        await asyncio.get_running_loop().run_in_executor(None, done.wait, 5.0)

    def shutdown(self) -> None:
        """Stop the engine (and its process); requests still in flight get EngineDeadError."""
        self._stop.set()
        self._commands.put(None)
        self._thread.join(timeout=10)
        self.engine.shutdown()
        self._went_down(RuntimeError("the engine was shut down"), "shutdown")

    # -- engine thread ------------------------------------------------------------------------

    def _run(self) -> None:
        """The engine loop in this thread; rebuilds the engine each time it is given up."""
        while True:
            exc = run_engine_loop(self.engine, self._drain_commands, self._deliver_step)
            if exc is None:
                return
            self._went_down(exc, "the engine failed; restarting it" if self._build else "the engine failed")
            self._flush_commands()
            _release(self.engine)
            if self._build is None:
                return
            engine = rebuild(self._build, self._stop)
            if engine is None:
                return
            self._came_back(engine, engine.stats())

    def _deliver_step(self, outputs: list[RequestOutput], stats: dict) -> None:
        self._stats = stats
        self._dispatch(outputs)

    def _went_down(self, exc: BaseException, why: str) -> None:
        """The engine is gone: every stream in flight ends now with EngineDeadError."""
        with self._lock:
            self._dead = exc
            streams, self._streams = self._streams, {}
        if why != "shutdown":
            logger.error("%s: %r", why, exc)
        error = EngineDeadError(f"{why}: {exc!r}")
        for stream in streams.values():
            _post(stream, error)

    def _came_back(self, engine, stats: dict) -> None:
        self.engine, self._stats = engine, stats
        with self._lock:
            if self._stop.is_set():  # shut down meanwhile: shutdown() may have missed this engine
                engine.shutdown()
                return
            self.restarts += 1
            self._dead = None
        logger.warning("the engine serves again (restart %d)", self.restarts)

    def _flush_commands(self) -> None:
        """Drop the commands the lost engine never applied (their streams were ended) and release
        the abort() calls waiting on them."""
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, _Abort) and cmd.done is not None:
                cmd.done.set()
            elif cmd is None:
                self._commands.put(None)  # shutdown asked meanwhile: keep it for the next loop
                return

    def _run_remote(self) -> None:
        """engine_process: read the child's messages; when it dies or gives up, spawn a new one."""
        forward: _Forwarder = self._commands
        while True:
            down = self._read_child(forward)
            if down is None or self._stop.is_set():
                return
            self._went_down(*down)
            forward.lost()
            old = self.engine
            old.shutdown()  # reap the child (it is dead or exiting)
            engine = rebuild(lambda: RemoteEngine(self._engine_kwargs, tokenizer=old.tokenizer, stop=self._stop),
                             self._stop)
            if engine is None:
                return
            forward.engine = engine
            self._came_back(engine, engine.initial_stats)

    def _read_child(self, forward: "_Forwarder") -> Optional[tuple[BaseException, str]]:
        """Dispatch the child's messages until it is gone, then (error, why); None when stopped."""
        while True:
            try:
                msg = self.engine.conn.recv()
            except (EOFError, OSError):
                if self._stop.is_set():
                    return None
                code = self.engine.exit_code(timeout=0.2)
                return (RuntimeError(f"the engine process (pid {self.engine_pid}) exited with code {code}"),
                        "engine process exited; restarting it")
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
                return RuntimeError(msg[1]), "the engine process gave up; restarting it"

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
        if isinstance(cmd, AddRequest):
            with self._lock:
                wanted = cmd.request_id in self._streams
            if not wanted:
                return  # the caller left (or its stream was ended) before the request reached the engine
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
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Callable[[object], None], RequestOutput]]] = {}
        with self._lock:
            for out in outputs:
                stream = self._streams.get(out.request_id)
                if stream is not None:
                    by_loop.setdefault(stream.loop, []).append((stream.put, out))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:
                pass  # that caller's loop is closed

    def _deliver(self, request_id: str, item: object) -> None:
        with self._lock:
            stream = self._streams.get(request_id)
        if stream is not None:
            _post(stream, item)


def _post(stream: _Stream, item: object) -> None:
    try:
        stream.loop.call_soon_threadsafe(stream.put, item)
    except RuntimeError:
        pass  # that caller's loop is closed


def _release(engine) -> None:
    """Let go of a failed in-process engine's device memory before its replacement is built (the
    object stays: callers may read its tokenizer and limits until the swap)."""
    try:
        engine.shutdown()
    except Exception:
        logger.exception("shutting down the failed engine failed")
    engine.runner = None
    gc.collect()
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except Exception:  # a CUDA context broken by the failure: the rebuild will say so
        logger.exception("freeing the failed engine's device memory failed")


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
            if isinstance(cmd, AddRequest):
                self.accumulators[cmd.request_id] = OutputAccumulator(cmd.request_id, cmd.token_ids, cmd.prompt)
                self.engine.send(cmd)
            elif isinstance(cmd, _Abort):
                token = next(self._tokens)
                if cmd.done is not None:
                    self.acks[token] = cmd.done
                self.engine.send(AbortRequest(cmd.request_id, token))
            elif cmd is None:
                self.engine.send(StopEngine())
        except OSError as exc:  # the engine process is gone; the reader reports it to every stream
            if isinstance(cmd, AddRequest):
                raise EngineDeadError(f"the engine process is gone: {exc}") from exc
            if isinstance(cmd, _Abort) and cmd.done is not None:
                cmd.done.set()  # nothing left to abort

    def lost(self) -> None:
        """The engine process is gone: forget its requests, release the abort() calls waiting."""
        self.accumulators.clear()
        acks, self.acks = self.acks, {}
        for done in acks.values():
            done.set()

    def outputs(self, deltas: list[tuple]) -> list[RequestOutput]:
        outs = []
        for raw in deltas:
            d = Delta._make(raw)
            acc = self.accumulators.get(d.request_id)
            if acc is None:
                continue  # rejected, or already finished
            outs.append(acc.apply(d))
            if d.finish_reason is not None:
                del self.accumulators[d.request_id]
        return outs


def _put_all(items: list[tuple[Callable[[object], None], RequestOutput]]) -> None:
    """One engine step's outputs of one loop's requests, on that loop."""
    for put, out in items:
        try:
            put(out)
        except Exception:  # a consumer's bug must not starve the step's other requests
            logger.exception("handing an output of %s to its consumer failed", out.request_id)


class OutputStream:
    """A request started with AsyncLLM.open(): delivers its outputs to `on_item` until it ends or
    is closed."""

    def __init__(self, llm: AsyncLLM, request_id: str, on_item: Callable[[object], None]) -> None:
        self.request_id = request_id
        self._llm, self._on_item = llm, on_item
        self.ended = False
        """A finished output or an exception was delivered: the engine holds nothing of it."""
        self.closed = False

    def _put(self, item: object) -> None:
        if self.ended or self.closed:
            return
        self.ended = isinstance(item, BaseException) or item.finished
        self._on_item(item)

    def close(self) -> None:
        """No more deliveries; aborts the request in the engine unless it ended. Idempotent."""
        if not self.closed:
            self.closed = True
            self._llm._close(self.request_id, self._put, self.ended)
