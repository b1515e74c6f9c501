"""The load generator of `bench serve`: closed loop (fixed concurrency) or open loop (arrivals).

Closed loop: `concurrency` workers each send their next request as soon as the previous one ends.
Open loop: requests arrive at `request_rate` per second with gamma-distributed gaps (shape =
burstiness; 1 is a Poisson process, smaller is burstier), optionally capped at `concurrency` in
flight. Either way the run is bounded: no request is sent after `max_duration` seconds, and
requests still running `grace` seconds later are cancelled and recorded as errors.
"""
from __future__ import annotations

import asyncio
import math
import random
import sys
import time
from dataclasses import dataclass
from typing import Optional

from tritongen.bench.datasets import BenchRequest
from tritongen.bench.results import RequestRecord
from tritongen.bench.targets import Target


@dataclass(frozen=True)
class LoadShape:
    concurrency: Optional[int] = None
    """Requests in flight (closed loop), or a cap on them in the open loop; None = no cap."""
    request_rate: float = math.inf
    """Arrivals per second (open loop); inf = closed loop."""
    burstiness: float = 1.0
    """Gamma shape of the arrival gaps: 1 = Poisson, < 1 burstier, > 1 more regular."""
    seed: int = 0
    max_duration: float = 3600.0
    """Seconds after which no new request is sent."""
    grace: float = 60.0
    """Seconds after max_duration before in-flight requests are cancelled."""
    request_timeout: float = 600.0


async def send_one(target: Target, req: BenchRequest, rec: RequestRecord, t0: float, timeout: float) -> None:
    """Send one request and fill `rec` with its timeline."""
    start = time.perf_counter()
    rec.start = start - t0
    counted, reported, last = 0, None, None
    unknown_counts = False
    try:
        async with asyncio.timeout(timeout):
            async for chunk in target.stream(req):
                now = time.perf_counter()
                if chunk.total_tokens is not None:
                    reported = chunk.total_tokens
                if not chunk.has_output:
                    continue
                if last is None:
                    rec.ttft = now - start
                else:
                    rec.itl.append(now - last)
                last = now
                if chunk.num_tokens is None:
                    unknown_counts = True
                else:
                    counted += chunk.num_tokens
        rec.latency = time.perf_counter() - start
        if rec.ttft is None or not target.streams:
            rec.ttft = rec.latency  # without streaming the first token arrives with the last
        rec.streamed = target.streams
        # Server's own total, else the sum of per-chunk counts, else what was asked for.
        rec.num_output_tokens = reported if reported is not None else \
            counted if not unknown_counts and counted else req.output_len
    except TimeoutError:
        rec.error = f"timeout after {timeout:g} s"
    except asyncio.CancelledError:
        rec.error = "cancelled: benchmark time limit"
        raise
    except Exception as exc:  # one failed request must not stop the run
        rec.error = f"{type(exc).__name__}: {exc}"


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, file=sys.stderr, unit="req", dynamic_ncols=True)


async def run_load(target: Target, requests: list[BenchRequest], shape: LoadShape,
                   progress: bool = True) -> tuple[list[RequestRecord], float]:
    """Run the whole load; returns the records of every request sent and the elapsed time."""
    records: list[RequestRecord] = []
    bar = _progress(len(requests), progress)
    t0 = time.perf_counter()
    deadline = t0 + shape.max_duration
    tasks: list[asyncio.Task] = []

    async def one(i: int, sem: Optional[asyncio.Semaphore]) -> None:
        rec = RequestRecord(i, requests[i].prompt_len, requests[i].output_len)
        records.append(rec)
        try:
            await send_one(target, requests[i], rec, t0, shape.request_timeout)
        finally:
            bar.update(1)
            if sem is not None:
                sem.release()

    if math.isinf(shape.request_rate):
        tasks = _closed_loop(requests, shape, deadline, one)
    else:
        tasks = await _open_loop(requests, shape, deadline, one)
    try:
        await _wait_bounded(tasks, deadline + shape.grace)
    finally:
        bar.close()
    elapsed = time.perf_counter() - t0
    records.sort(key=lambda r: r.index)
    return records, elapsed


def _closed_loop(requests: list[BenchRequest], shape: LoadShape, deadline: float, one) -> list[asyncio.Task]:
    next_index = iter(range(len(requests)))

    async def worker() -> None:
        for i in next_index:  # the iterator is shared: each index goes to one worker
            if time.perf_counter() >= deadline:
                return
            await one(i, None)

    workers = min(shape.concurrency or len(requests), len(requests))
    return [asyncio.create_task(worker()) for _ in range(workers)]


async def _open_loop(requests: list[BenchRequest], shape: LoadShape, deadline: float, one) -> list[asyncio.Task]:
    rng = random.Random(shape.seed)
    sem = asyncio.Semaphore(shape.concurrency) if shape.concurrency else None
    tasks = []
    for i in range(len(requests)):
        if time.perf_counter() >= deadline:
            break
        if sem is not None:
            await sem.acquire()
        tasks.append(asyncio.create_task(one(i, sem)))
        if i + 1 < len(requests):
            # Mean gap 1/rate; the gamma shape sets how bursty the arrivals are.
            gap = rng.gammavariate(shape.burstiness, 1.0 / (shape.request_rate * shape.burstiness))
            await asyncio.sleep(min(gap, max(0.0, deadline - time.perf_counter())))
    return tasks


async def _wait_bounded(tasks: list[asyncio.Task], hard_deadline: float) -> None:
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, hard_deadline - time.perf_counter()))
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


async def run_serve_benchmark(target: Target, requests: list[BenchRequest], shape: LoadShape,
                              warmup: int = 0, progress: bool = True) -> tuple[list[RequestRecord], float]:
    """Start the target, send `warmup` unrecorded requests, run the load, close the target."""
    await target.start()
    try:
        for req in requests[:warmup]:
            await send_one(target, req, RequestRecord(-1, req.prompt_len, req.output_len), time.perf_counter(),
                           shape.request_timeout)
        return await run_load(target, requests, shape, progress)
    finally:
        await target.close()
