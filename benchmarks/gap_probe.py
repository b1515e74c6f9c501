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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="dummy:llama-2-7b")
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    llm = LLM(args.model, dtype="bfloat16", device="cuda")
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
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                eng.step()
            torch.cuda.synchronize()
        g = _gaps(_kernels(prof), args.steps)
        eng.abort(name)
        while eng.has_unfinished():
            eng.step()
        print(f"{name:10s} wall {wall:.3f} ms/step | kernels {g['kernels_per_step']:.0f}/step busy {g['busy_ms']:.3f} ms"
              f" | gaps <5us {g['gap_lt5us_ms']:.3f} ms, 5-50us {g['gap_5_50us_ms']:.3f} ms, >=50us "
              f"{g['gap_ge50us_ms']:.3f} ms ({g['large_gaps_per_step']:.1f}/step)", flush=True)
        for (a, b), us in g["top_large"]:
            print(f"    large gaps {us / args.steps:8.1f} us/step after {a!r} before {b!r}")
    graphs = eng.runner.graphs
    if graphs is not None:
        twins = graphs.graphs[1]
        for label, pick in (("the same graph", lambda i: twins[0]), ("the two twins in turn", lambda i: twins[i % 2])):
            for i in range(5):
                pick(i).replay()
            torch.cuda.synchronize()
            host = 0.0
            t0 = time.perf_counter()
            for i in range(50):
                h0 = time.perf_counter()
                pick(i).replay()
                host += time.perf_counter() - h0
            torch.cuda.synchronize()
            print(f"batch-1 graph, {label}, replayed back to back: {(time.perf_counter() - t0) / 50 * 1e3:.3f} ms "
                  f"per replay, host inside replay() {host / 50 * 1e3:.3f} ms (model only, no logits or sampling)")

if __name__ == "__main__":
    main()
