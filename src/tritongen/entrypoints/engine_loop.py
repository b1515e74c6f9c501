"""The engine loop and what keeps it serving: failure isolation per step, and restarts.

A step that raises fails only the requests scheduled in it (EngineCore.fail_step: finish_reason
"error"); the other requests go on. The engine is given up — and its owner (AsyncLLM, in a thread
or over an engine process) rebuilds it from its config — only when steps keep failing
(MAX_CONSECUTIVE_FAILURES in a row) or the error is one the process cannot recover from (a CUDA
error poisons the context). Used by AsyncLLM's engine thread and by the engine process alike.
"""
from __future__ import annotations

import itertools
import logging
import threading
from typing import Callable, Optional, TypeVar

from tritongen.types import RequestOutput

logger = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 3
"""Failed steps in a row after which the engine is rebuilt: one bad request fails one step; steps
that keep failing with different requests mean the engine itself is broken."""
_RESTART_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
"""Waits between attempts when rebuilding fails (the last repeats until shutdown)."""

T = TypeVar("T")


def is_fatal(exc: BaseException) -> bool:
    """Errors after which this process's device state cannot be trusted: restart at once.
    By name and message, so that this module needs no torch."""
    if getattr(exc, "fatal", False) or type(exc).__name__ == "AcceleratorError":
        return True
    text = str(exc)
    return "CUDA error" in text or "illegal memory access" in text or "device-side assert" in text


def run_engine_loop(engine, drain: Callable[[bool], bool],
                    deliver: Callable[[list[RequestOutput], dict], None],
                    max_failures: int = MAX_CONSECUTIVE_FAILURES) -> Optional[BaseException]:
    """Apply commands (waiting for one when idle), step, hand the outputs on. Returns None when
    drain() says stop, or the exception that gave the engine up (its owner restarts it); the
    outputs of the failed steps (their requests' errors) are delivered before that."""
    failures = 0
    while True:
        if not drain(not engine.has_unfinished()):
            return None
        if not engine.has_unfinished():
            continue
        try:
            outputs = engine.step()
            failures = 0
        except Exception as exc:
            logger.exception("engine step failed; its requests end with finish_reason 'error'")
            failures += 1
            try:
                outputs = engine.fail_step(exc)
            except Exception:
                logger.exception("failing the step's requests failed too")
                return exc
            if failures >= max_failures or is_fatal(exc):
                deliver(outputs, engine.stats())
                return exc
        deliver(outputs, engine.stats())


def rebuild(build: Callable[[], T], stop: threading.Event) -> Optional[T]:
    """build() until it succeeds, waiting longer after each failure; None once `stop` is set."""
    for attempt in itertools.count():
        if stop.is_set():
            return None
        try:
            return build()
        except Exception:
            delay = _RESTART_DELAYS_S[min(attempt, len(_RESTART_DELAYS_S) - 1)]
            logger.exception("restarting the engine failed (attempt %d); next try in %.1f s", attempt + 1, delay)
            if stop.wait(delay):
                return None
