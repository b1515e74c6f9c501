"""Where a batch-1 decode step's device time goes between kernels: for each engine loop
(asynchronous scheduling, pipelined, sequential) profile decode steps and split the idle time of
the GPU stream into small gaps (inside a CUDA graph) and large ones (the device waiting for the
host); also replay the batch-1 graph alone back to back (no host work at all).

    PYTHONPATH=$PWD/src TRITONGEN_CACHE=$PWD/.gpu/tokcache python3 benchmarks/gap_probe.py --model dummy:llama-2-7b
"""
from __future__ import annotations

import argparse
import time
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from tritongen import LLM
from tritongen.bench.offline import fixed_length_params


def _kernels(prof) -> list[tuple[float, float, str]]:
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() >= 0]
    return sorted((e.time_range.start, e.time_range.end, e.name) for e in evs)


def _gaps(kernels, steps: int) -> dict:
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


def _host_breakdown(eng, steps: int) -> str:
    """Host ms/step inside each phase of the loop (perf_counter around the engine's calls)."""
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
        eng.step()
        spent["step()"] += time.perf_counter() - s0
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    for obj, attr, fn in originals:
        setattr(obj, attr, fn) if attr != "replay" else obj.__dict__.pop("replay", None)
    lines = [f"    host breakdown over {steps} steps (wall {wall / steps * 1e3:.3f} ms/step):"]
    lines += [f"      {k:24s} {v / steps * 1e3:7.3f} ms/step" for k, v in sorted(spent.items(), key=lambda kv: kv[0])]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="dummy:llama-2-7b")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cuda", help="cpu only checks the script (tiny model, nothing to see)")
    args = ap.parse_args()
    if args.device == "cpu":
        torch.cuda.synchronize = lambda: None  # noqa: E731 - a smoke run of the script
    llm = LLM(args.model, dtype="bfloat16" if args.device == "cuda" else "float32", device=args.device)
    eng = llm.engine
    modes = {"async": (True, True), "pipelined": (True, False), "sequential": (False, False)}
    for name, (pipelined, async_) in modes.items():
        eng.pipelined, eng.async_scheduling = pipelined, async_
        eng.add_request(name, list(range(100, 228)), fixed_length_params(4 * args.steps + 40))
        for _ in range(10):
            eng.step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            eng.step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / args.steps * 1e3
        with profile(activities=[ProfilerActivity.CUDA if args.device == "cuda" else ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                eng.step()
            torch.cuda.synchronize()
        g = _gaps(_kernels(prof), args.steps)
        breakdown = _host_breakdown(eng, args.steps)
        eng.abort(name)
        while eng.has_unfinished():
            eng.step()
        print(f"{name:10s} wall {wall:.3f} ms/step | kernels {g['kernels_per_step']:.0f}/step busy {g['busy_ms']:.3f} ms"
              f" | gaps <5us {g['gap_lt5us_ms']:.3f} ms, 5-50us {g['gap_5_50us_ms']:.3f} ms, >=50us "
              f"{g['gap_ge50us_ms']:.3f} ms ({g['large_gaps_per_step']:.1f}/step)", flush=True)
        for (a, b), us in g["top_large"]:
            print(f"    large gaps {us / args.steps:8.1f} us/step after {a!r} before {b!r}")
        print(breakdown, flush=True)
    graphs = eng.runner.graphs
    if graphs is not None:
        g1 = graphs.graphs[1]
        for _ in range(5):
            g1.replay()
        torch.cuda.synchronize()
        host = 0.0
        t0 = time.perf_counter()
        for _ in range(50):
            h0 = time.perf_counter()
            g1.replay()
            host += time.perf_counter() - h0
        torch.cuda.synchronize()
        print(f"batch-1 graph replayed back to back: {(time.perf_counter() - t0) / 50 * 1e3:.3f} ms per replay, "
              f"host inside replay() {host / 50 * 1e3:.3f} ms (model only, no logits or sampling)")

if __name__ == "__main__":
    main()
