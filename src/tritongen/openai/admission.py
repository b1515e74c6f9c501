"""Admission control: how many engine requests the server holds at once, counted when admitted.

The engine's num_waiting lags a burst: requests still being parsed, tokenized or queued to the
engine thread are not in it yet, so a bound on it lets a burst of any size in. Here every engine
request (each prompt of a multi-prompt completion is one) holds a slot from the moment it is
admitted until its response is over, and a request that does not fit gets a 503 at once, before
any tokenizing. The bound is max_num_seqs (the running batch) + max_queue (what may wait), as
on the Triton front; max_queue 0 means no bound (in-flight requests are still counted).

Confined to the server's event loop: admit and release run on it only, so no lock is needed.
"""
from __future__ import annotations

from typing import Optional

from tritongen.openai.serving import RequestError

REJECTED = "tritongen_request_rejected_total"


class Ticket:
    """Slots held by one HTTP request; release() is idempotent so every exit path may call it."""

    def __init__(self, admission: "Admission", slots: int) -> None:
        self._admission, self.slots = admission, slots

    def release(self) -> None:
        if self.slots:
            self._admission.in_flight -= self.slots
            self.slots = 0


class Admission:
    def __init__(self, max_num_seqs: int, max_queue: int, metrics=None) -> None:
        self.max_num_seqs, self.max_queue = max_num_seqs, max_queue
        self.capacity = max_num_seqs + max_queue if max_queue > 0 else None
        self.in_flight = 0
        self.metrics = metrics  # a MetricsSink with the REJECTED counter, or None

    def admit(self, slots: int) -> Ticket:
        """Hold `slots` engine requests, or raise a 503 RequestError if they do not all fit."""
        if self.capacity is not None and self.in_flight + slots > self.capacity:
            if self.metrics is not None:
                self.metrics.increment(REJECTED, 1)
            raise RequestError(
                f"server overloaded: {self.in_flight} requests in flight, {slots} more would pass the limit of "
                f"{self.capacity} (max_num_seqs {self.max_num_seqs} + max_queue {self.max_queue}); retry later",
                status=503, type="service_unavailable", code="overloaded")
        self.in_flight += slots
        return Ticket(self, slots)


def engine_max_num_seqs(engine, given: Optional[int] = None) -> int:
    """`given`, else the running-batch size of an AsyncLLM's engine when it runs in this process,
    else the SchedulerConfig default (an engine process keeps its scheduler to itself)."""
    if given is not None:
        return given
    scheduler = getattr(getattr(engine, "engine", None), "scheduler", None)
    if scheduler is not None:
        return scheduler.config.max_num_seqs
    from tritongen.config import SchedulerConfig

    return SchedulerConfig().max_num_seqs
