"""The send side of the `llm` model: sender threads, the tensor cache, and metric updates, applied
in batches off the loop (one round trip per counter series per flush, none on a streamed send).
In python_backend a send, like a metric update, is a blocking round trip to the server
process (the GIL is released while it waits); the model's asyncio loop must never make one.

A send costs the loop one asyncio future and one call_soon_threadsafe when it completes: no
concurrent.futures.Future (its Condition) and no executor wrapping, which at thousands of
responses per second were a measurable share of the stub's GIL time (docs/benchmarks.md, issue 29).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
from typing import Callable, Optional

import numpy as np

logger = logging.getLogger(__name__)


class SendThreads:
    """`count` daemon threads running the calls handed to submit(), in arrival order per thread."""

    def __init__(self, count: int, name: str) -> None:
        self._jobs: "queue.SimpleQueue" = queue.SimpleQueue()
        self._stopped = False
        self._threads = [threading.Thread(target=self._run, name=f"{name}_{i}", daemon=True) for i in range(count)]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable, *args) -> None:
        self._jobs.put((fn, args))

    def shutdown(self) -> None:
        """Stop the threads; calls not started yet are dropped (the model is going away)."""
        self._stopped = True
        for _ in self._threads:
            self._jobs.put(None)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None or self._stopped:
                return
            fn, args = job
            try:
                fn(*args)
            except BaseException:  # fn reports its own outcome; this keeps the thread alive
                logger.exception("a send job failed")


def send_on(pool, call: Callable[[], object]) -> asyncio.Future:
    """Run `call` on `pool` (SendThreads, or any executor with submit(fn, *args)); the future, on
    the running loop, completes with its outcome."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    pool.submit(_run_and_settle, loop, future, call)
    return future


def _run_and_settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future, call: Callable[[], object]) -> None:
    try:
        call()
        error: Optional[BaseException] = None
    except BaseException as exc:
        error = exc
    try:
        loop.call_soon_threadsafe(_settle, future, error)
    except RuntimeError:
        pass  # the loop is closed: nobody waits any more


def _settle(future: asyncio.Future, error: Optional[BaseException]) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


METRICS_LOCK = threading.Lock()
"""One metric update at a time in the process: python_backend 24.10 aborts the server
(boost::interprocess::lock_exception) when two threads of a stub update metrics at once."""

_PENDING: collections.deque[tuple[object, str, tuple]] = collections.deque()
"""Metric updates handed over (MetricOps.defer) and not applied yet: (sink, method, args)."""


def flush_metrics() -> None:
    """Apply every pending metric update, counter increments of one series summed into one update
    (a round trip to the server each). Taken and applied under METRICS_LOCK: once a caller holds
    the lock, every update handed over before it is applied (by it, or by the flush that held the
    lock before). Called before each FINAL and by the model's watcher (gauges, every CANCEL_POLL_S)."""
    with METRICS_LOCK:
        merged: dict[tuple, list] = {}
        ordered: list[list] = []
        while _PENDING:
            sink, method, args = _PENDING.popleft()
            if method == "increment":
                name, value, labels = args
                key = (id(sink), name, tuple(sorted(labels.items())) if labels else ())
                entry = merged.get(key)
                if entry is not None:
                    entry[2][1] += value
                    continue
                entry = merged[key] = [sink, method, [name, value, labels]]
            else:
                entry = [sink, method, args]
            ordered.append(entry)
        for sink, method, args in ordered:
            try:
                getattr(sink, method)(*args)
            except Exception:
                logger.debug("metric update %s%r failed", method, args, exc_info=True)


class MetricOps:
    """A MetricsSink that records one request's updates, off the loop: no update is a round trip
    where it is recorded. defer() hands them to the updates pending in the process (applied by the
    next flush_metrics: the watcher's, within CANCEL_POLL_S, or a FINAL's); apply() flushes them,
    before the request's FINAL, so that a client that saw the FINAL sees its request counted.
    Streamed sends carry no metric round trip."""

    def __init__(self, sink) -> None:
        self._sink = sink
        self._ops: list[tuple[str, tuple]] = []

    def observe(self, name: str, value: float) -> None:
        self._ops.append(("observe", (name, value)))

    def increment(self, name: str, value: float, labels: Optional[dict] = None) -> None:
        self._ops.append(("increment", (name, value, labels)))

    def set_gauge(self, name: str, value: float) -> None:
        self._ops.append(("set_gauge", (name, value)))

    def defer(self) -> None:
        if self._ops:
            ops, self._ops = self._ops, []
            _PENDING.extend((self._sink, method, args) for method, args in ops)

    def apply(self) -> None:
        self.defer()
        flush_metrics()


class TensorCache:
    """Output tensors built once and sent again: a stand-in for pb_utils that make_response builds
    with, whose Tensor() returns the tensor already sent with the same name and value (a streamed
    response's text piece of a few bytes, its token count). python_backend copies a Tensor into
    shared memory on its first send and reuses that copy on every later one; a cached tensor skips
    the Tensor construction (BYTES: the stub's Python serializer), the shared-memory allocation and
    the copy. A tensor enters the cache only once sent (admit()), so that no two threads ever make
    its first copy at once; values past `max_value_bytes` and entries past `max_entries` are not
    kept, and only the outputs in CACHED whose values repeat (never timings, which would fill it)."""

    CACHED = frozenset({"text_output", "output_ids", "sequence_length", "num_output_tokens"})

    def __init__(self, pb, max_entries: int = 16384, max_value_bytes: int = 64) -> None:
        self._pb = pb
        self._cache: dict[tuple, object] = {}
        self._fresh: list[tuple[tuple, object]] = []
        self.max_entries, self.max_value_bytes = max_entries, max_value_bytes

    def __getattr__(self, name: str):
        return getattr(self._pb, name)  # InferenceResponse, TritonError, ... as pb_utils has them

    def Tensor(self, name: str, array):  # noqa: N802 (pb_utils' name)
        key = self._key(name, array) if name in self.CACHED else None
        if key is None:
            return self._pb.Tensor(name, array)
        tensor = self._cache.get(key)
        if tensor is None:
            tensor = self._pb.Tensor(name, array)
            self._fresh.append((key, tensor))
        return tensor

    def text(self, name: str, value: str, batch_dim: bool):
        """The BYTES tensor holding one string (a streamed response's text piece), looked up before
        any array is built: the same tensor Tensor(name, array of [value]) would give."""
        data = value.encode("utf-8")
        shape = (1, 1) if batch_dim else (1,)
        key = self._bytes_key(name, shape, (data,)) if name in self.CACHED else None
        tensor = self._cache.get(key) if key is not None else None
        if tensor is None:
            tensor = self.Tensor(name, np.array([data], dtype=np.object_).reshape(shape))
        return tensor

    def take_fresh(self) -> list[tuple[tuple, object]]:
        """The tensors built since the last call (on the loop, right after building a response)."""
        fresh, self._fresh = self._fresh, []
        return fresh

    def admit(self, fresh: list[tuple[tuple, object]]) -> None:
        """After the response holding `fresh` was sent (sender thread)."""
        for key, tensor in fresh:
            if len(self._cache) < self.max_entries:
                self._cache.setdefault(key, tensor)

    def _bytes_key(self, name: str, shape: tuple, values: tuple) -> Optional[tuple]:
        """The cache key of a BYTES tensor of `values` (bytes), None past max_value_bytes."""
        if sum(len(v) for v in values) > self.max_value_bytes:
            return None
        return name, "O", shape, values

    def _key(self, name: str, array) -> Optional[tuple]:
        if array.dtype.kind == "O":
            values = tuple(array.flat)
            return self._bytes_key(name, array.shape, values) if all(type(v) is bytes for v in values) else None
        if array.nbytes > self.max_value_bytes:
            return None
        return name, array.dtype.str, array.shape, array.tobytes()


class LoopCalls:
    """Calls posted from other threads (the sender threads' completions), run on `loop` in batches:
    one call_soon_threadsafe, one wake-up of the loop, for every call posted while the previous
    batch had not run yet, instead of one per send."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._calls: list[tuple[Callable, tuple]] = []
        self._lock = threading.Lock()

    def post(self, fn: Callable, *args) -> None:
        with self._lock:
            self._calls.append((fn, args))
            first = len(self._calls) == 1
        if first:
            try:
                self.loop.call_soon_threadsafe(self._run)
            except RuntimeError:
                pass  # the loop is closed: nobody waits any more

    def _run(self) -> None:
        with self._lock:
            calls, self._calls = self._calls, []
        for fn, args in calls:
            try:
                fn(*args)
            except Exception:
                logger.exception("a call posted to the loop failed")
