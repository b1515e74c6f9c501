"""Where the time of engine steps goes, for the profiling probes (benchmarks/probes/gap_probe.py,
tp_host_probe.py): the CUDA kernels torch.profiler saw, the idle gaps between them, and the host's
time per phase of the engine loop."""
from __future__ import annotations

import time
from collections import Counter

import torch


def kernel_spans(prof) -> list[tuple[float, float, str]]:
    """(start µs, end µs, name) of every CUDA kernel torch.profiler recorded, in start order."""
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() >= 0]
    return sorted((e.time_range.start, e.time_range.end, e.name) for e in evs)


def device_gaps(kernels, steps: int) -> dict:
    """Per step: kernel time, idle time of the stream by gap size (< 5 µs: inside a graph; >= 50 µs:
    the device waiting for the host), and the kernel pairs around the largest gaps."""
    small = mid = large = 0.0
    n_large = 0
    pairs: Counter = Counter()
    for (s0, e0, n0), (s1, e1, n1) in zip(kernels, kernels[1:]):
        gap = s1 - e0
        if gap <= 0:
            continue
        if gap < 5:
            small += gap
        elif gap < 50:
            mid += gap
        else:
            large += gap
            n_large += 1
            pairs[(n0[:40], n1[:40])] += gap
    busy = sum(e - s for s, e, _ in kernels)
    return {"busy_ms": busy / steps / 1e3, "gap_lt5us_ms": small / steps / 1e3, "gap_5_50us_ms": mid / steps / 1e3,
            "gap_ge50us_ms": large / steps / 1e3, "large_gaps_per_step": n_large / steps,
            "kernels_per_step": len(kernels) / steps, "top_large": pairs.most_common(4)}


def kernel_table(kernels, steps: int, top: int = 14) -> str:
    """The kernels by device time per step, summed by name (names cut to 70 characters)."""
    total: Counter = Counter()
    calls: Counter = Counter()
    for s, e, name in kernels:
        total[name[:70]] += e - s
        calls[name[:70]] += 1
    lines = [f"    {'kernel':70s} {'us/step':>8s} {'calls/step':>10s}"]
    lines += [f"    {name:70s} {us / steps:8.1f} {calls[name] / steps:10.1f}" for name, us in total.most_common(top)]
    return "\n".join(lines)


def host_breakdown(eng, steps: int, step=None) -> str:
    """Host ms/step inside each phase of the loop (perf_counter around the engine's calls) over
    `steps` calls of `step` (default eng.step)."""
    import functools

    spent: Counter = Counter()

    def timed(obj, attr, label):
        fn = getattr(obj, attr)

        @functools.wraps(fn)
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                out = fn(*a, **k)
            finally:
                spent[label] += time.perf_counter() - t0
            if label == "launch":  # also time the wait closure it returns
                def wait():
                    t1 = time.perf_counter()
                    try:
                        return out()
                    finally:
                        spent["wait (result)"] += time.perf_counter() - t1
                return wait
            return out
        setattr(obj, attr, wrapper)
        return fn

    outer = eng.runner
    r = getattr(outer, "runner", outer)  # tensor parallel: rank 0's own ModelRunner
    originals = [(outer, "launch", timed(outer, "launch", "launch"))]
    workers = getattr(outer, "_workers", None)
    if workers is not None:
        originals.append((workers, "send", timed(workers, "send", "  send to workers")))
    if r.graphs is not None:
        originals.append((r.graphs, "run", timed(r.graphs, "run", "  graphs.run")))
        if 1 in r.graphs.graphs:
            originals.append((r.graphs.graphs[1], "replay", timed(r.graphs.graphs[1], "replay", "    replay")))
    originals.append((r.model, "compute_logits", timed(r.model, "compute_logits", "  compute_logits")))
    originals.append((r.sampler, "sample_async", timed(r.sampler, "sample_async", "  sample_async")))
    for attr in ("update", "schedule", "schedule_ahead"):
        originals.append((eng.scheduler, attr, timed(eng.scheduler, attr, f"scheduler.{attr}")))
    originals.append((eng, "_emit", timed(eng, "_emit", "emit")))
    t0 = time.perf_counter()
    for _ in range(steps):
        spent["step()"] -= 0
        s0 = time.perf_counter()
        (step or eng.step)()
        spent["step()"] += time.perf_counter() - s0
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    for obj, attr, fn in originals:
        setattr(obj, attr, fn) if attr != "replay" else obj.__dict__.pop("replay", None)
    lines = [f"    host breakdown over {steps} steps (wall {wall / steps * 1e3:.3f} ms/step):"]
    lines += [f"      {k:24s} {v / steps * 1e3:7.3f} ms/step" for k, v in sorted(spent.items(), key=lambda kv: kv[0])]
    return "\n".join(lines)
