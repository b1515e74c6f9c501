"""The engine loop in a process of its own: `AsyncLLM(..., engine_process=True)`.

Why: in one process the engine thread's Python work (scheduling, detokenizing) shares the GIL
with everything the frontend does per token; inside Triton's Python stub that frontend work (a
response, its tensors and a blocking send per token per request) lengthens every engine step
(docs/benchmarks.md, serving). Here the child process owns the EngineCore (model, KV cache, scheduler, detokenizers); the parent
keeps the tokenizer (it validates and tokenizes in the caller's thread) and a reader thread.

Protocol over one socket pair (multiprocessing Connection, pickled):
  parent -> child: the engine options (a dict, first), then AddRequest, AbortRequest, StopEngine
  child -> parent: ("ready", limits, stats), ("step", [Delta as a tuple], stats), ("rejected", request_id, message),
                   ("aborted", ack), ("dead", message) (the engine was given up; the child exits)
A step travels as deltas only (new token ids and text, finish reason, new logprobs): the parent
rebuilds each RequestOutput's cumulative fields, so a message's size does not grow with the
length of the outputs. The child exits when the socket closes or its parent goes away. When the
child dies or gives up, AsyncLLM ends the requests in flight and spawns a new one.
"""
from __future__ import annotations

import logging
import operator
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field, fields
from multiprocessing.connection import Connection
from typing import Any, NamedTuple, Optional

from tritongen.core.engine import EngineLimits, Prompt, tokenize, validate
from tritongen.processes import end_process, exit_with_parent, spawn_module
from tritongen.types import RequestOutput, RequestTimes, SamplingParams, TokenLogprob

logger = logging.getLogger(__name__)

_STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class AddRequest:
    """A request for the engine, validated and tokenized by the caller (also AsyncLLM's command)."""

    request_id: str
    token_ids: list[int]
    params: SamplingParams
    prompt: Optional[str]
    """The prompt's text when it came as text (outputs echo it), else None."""


@dataclass(frozen=True)
class AbortRequest:
    """Abort one request; the child answers ("aborted", ack) once its blocks are free."""

    request_id: str
    ack: int


@dataclass(frozen=True)
class StopEngine:
    """End the engine loop; the child exits."""


class Delta(NamedTuple):
    """What one step adds to one request's output. It travels as a plain tuple in this order
    (`to_delta`; the parent reads it with `Delta._make`), RequestTimes as a tuple of its fields: a
    step of 512 dataclass deltas with their RequestTimes took ~1.4 ms to build and pickle in the
    engine process and ~1.35 ms to load in the parent (CPU), plain tuples ~0.3 ms each."""

    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: Optional[str]
    logprobs: Optional[list[TokenLogprob]]
    cumulative_logprob: Optional[float]
    num_cached_tokens: int
    error: Optional[str]
    prompt_logprobs: Optional[list[Optional[TokenLogprob]]]
    times: Optional[tuple] = None
    """RequestTimes' fields, in order."""


_TIME_FIELDS = operator.attrgetter(*(f.name for f in fields(RequestTimes)))


def to_delta(out: RequestOutput, first: bool) -> tuple:
    """The wire form of a Delta (a plain tuple)."""
    return (out.request_id, out.delta_token_ids, out.delta_text, out.finish_reason, out.delta_logprobs,
            out.cumulative_logprob, out.num_cached_tokens, out.error, out.prompt_logprobs if first else None,
            None if out.times is None else _TIME_FIELDS(out.times))


@dataclass
class OutputAccumulator:
    """Parent side of one request: rebuilds cumulative RequestOutputs from the child's deltas."""

    request_id: str
    prompt_token_ids: list[int]
    prompt: Optional[str]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: Optional[list[TokenLogprob]] = None
    prompt_logprobs: Optional[list[Optional[TokenLogprob]]] = None

    def apply(self, d: Delta) -> RequestOutput:
        self.text += d.text
        self.token_ids = self.token_ids + d.token_ids  # a new list: earlier outputs stay as they were
        if d.logprobs is not None:
            self.logprobs = (self.logprobs or []) + d.logprobs
        if d.prompt_logprobs is not None:
            self.prompt_logprobs = d.prompt_logprobs
        return RequestOutput(request_id=self.request_id, prompt_token_ids=self.prompt_token_ids, text=self.text,
                             token_ids=self.token_ids, delta_text=d.text, delta_token_ids=d.token_ids,
                             finish_reason=d.finish_reason, prompt=self.prompt, logprobs=self.logprobs,
                             delta_logprobs=d.logprobs, prompt_logprobs=self.prompt_logprobs,
                             cumulative_logprob=d.cumulative_logprob, num_cached_tokens=d.num_cached_tokens,
                             error=d.error, times=None if d.times is None else RequestTimes(*d.times))


class RemoteEngine:
    """Parent-side stand-in for EngineCore: what frontends read of `AsyncLLM.engine` (tokenizer,
    limits, tokenize, validate), plus the child process and its connection."""

    def __init__(self, kwargs: dict, tokenizer=None, stop: Optional[threading.Event] = None) -> None:
        """Start the engine process and wait until it has loaded. `tokenizer`: the one a previous
        engine process of the same options used (a restart); `stop` set: give up loading (the
        child is ended) with RuntimeError."""
        from tritongen.config import EngineConfig
        from tritongen.entrypoints.llm import _tokenizer_path
        from tritongen.fetch import resolve_model
        from tritongen.tokenizer import load_tokenizer

        if kwargs.get("log_level") is None:  # the child logs as this process does
            kwargs = {**kwargs, "log_level": logging.getLevelName(logging.getLogger().getEffectiveLevel())}
        config = EngineConfig.from_kwargs(**kwargs)  # bad options fail here, before a process starts
        self.tokenizer = tokenizer or load_tokenizer(_tokenizer_path(config, resolve_model(config.model.model)))
        self._send_lock = threading.Lock()
        parent_sock, child_sock = socket.socketpair()
        self.proc = spawn_module("tritongen.entrypoints.engine_process", child_sock.fileno())
        child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self.send(kwargs)
        self.limits, self.initial_stats = self._wait_ready(stop)

    def _wait_ready(self, stop: Optional[threading.Event]) -> tuple[EngineLimits, dict]:
        while not self.conn.poll(0.2):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the engine process exited with code {self.proc.returncode} while loading")
            if stop is not None and stop.is_set():
                self.proc.terminate()  # it reads no command while it loads
                self.shutdown()
                raise RuntimeError("stopped while the engine process was loading")
        try:
            msg = self.conn.recv()
        except EOFError:
            self.proc.wait(_STOP_TIMEOUT_S)
            raise RuntimeError(f"the engine process exited with code {self.proc.returncode} while loading") from None
        if msg[0] == "dead":
            self.shutdown()
            raise RuntimeError(f"the engine process failed to load: {msg[1]}")
        return msg[1], msg[2]

    def send(self, msg: Any) -> None:
        with self._send_lock:
            self.conn.send(msg)

    def tokenize(self, prompt: Prompt) -> list[int]:
        return tokenize(self.tokenizer, self.limits, prompt)

    def validate(self, prompt: Prompt, params: SamplingParams) -> list[int]:
        return validate(self.tokenizer, self.limits, prompt, params)

    def exit_code(self, timeout: float) -> Optional[int]:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def shutdown(self) -> None:
        """Ask the child to stop, then wait; terminate and kill if it does not. Idempotent."""
        if self.proc.poll() is None:
            try:
                self.send(StopEngine())
            except OSError:
                pass
        end_process(self.proc, _STOP_TIMEOUT_S)
        self.conn.close()


# -- the child ----------------------------------------------------------------------------------


class _ChildLoop:
    def __init__(self, conn: Connection, engine) -> None:
        self.conn, self.engine = conn, engine
        self.seen: set[str] = set()  # requests that already sent their first delta

    def run(self) -> None:
        """The engine loop; when it gives the engine up, say so and return (the process exits
        and the parent spawns a new one: a fresh process also clears a broken CUDA context)."""
        from tritongen.entrypoints.engine_loop import run_engine_loop

        exc = run_engine_loop(self.engine, self.drain, self.dispatch)
        if exc is not None:
            self.conn.send(("dead", repr(exc)))

    def drain(self, block: bool) -> bool:
        """Apply every command waiting (wait up to 0.5 s for one when idle); False on stop."""
        if not self.conn.poll(0.5 if block else 0):
            return True
        while True:
            try:
                msg = self.conn.recv()
            except EOFError:
                return False  # the parent closed its end or died
            if isinstance(msg, StopEngine):
                return False
            if isinstance(msg, AddRequest):
                try:
                    self.engine.add_request(msg.request_id, msg.token_ids, msg.params, msg.prompt)
                except Exception as exc:
                    self.conn.send(("rejected", msg.request_id, str(exc)))
            elif isinstance(msg, AbortRequest):
                self.engine.abort(msg.request_id)
                self.conn.send(("aborted", msg.ack))
            if not self.conn.poll(0):
                return True

    def dispatch(self, outputs: list[RequestOutput], stats: dict) -> None:
        deltas = []
        for out in outputs:
            first = out.request_id not in self.seen
            deltas.append(to_delta(out, first))
            if out.finished:
                self.seen.discard(out.request_id)
            else:
                self.seen.add(out.request_id)
        self.conn.send(("step", deltas, stats))


def child_main(fd: int) -> int:
    from tritongen.config import EngineConfig
    from tritongen.entrypoints.llm import create_engine

    exit_with_parent(os.getppid())
    conn = Connection(fd)
    kwargs = conn.recv()
    logging.basicConfig(level=kwargs.get("log_level") or logging.WARNING,
                        format="[engine process] %(levelname)s %(name)s: %(message)s")
    try:
        engine = create_engine(EngineConfig.from_kwargs(**kwargs))
    except Exception as exc:
        logger.exception("loading the engine failed")
        conn.send(("dead", repr(exc)))
        return 1
    conn.send(("ready", engine.limits, engine.stats()))
    try:
        _ChildLoop(conn, engine).run()
    finally:
        engine.shutdown()
        conn.close()
    return 0


if __name__ == "__main__":
    # Run the imported module's function: what pickles by class (AddRequest, ...) must pickle under
    # tritongen.entrypoints.engine_process, not __main__.
    from tritongen.entrypoints import engine_process

    sys.exit(engine_process.child_main(int(sys.argv[1])))
