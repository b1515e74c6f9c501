"""Where a decode step's device time goes between kernels (batch 1 by default; `--batch N` runs N
sequences of `--prompt-len` tokens, all past their prefill when measured): for each engine loop
(asynchronous scheduling, pipelined, sequential) profile decode steps and split the idle time of
the GPU stream into small gaps (inside a CUDA graph) and large ones (the device waiting for the
host), list the kernels by device time per step; also replay the batch-1 graph alone back to back (no
host work at all). `--mixed-prompt-len P` adds a new request of P prompt tokens (one output token)
before every measured step, so each step is a mixed one: the batch's decode rows plus one prefill,
as in serving, where about a fifth of the steps carry a prompt.

    PYTHONPATH=$PWD/src TRITONGEN_CACHE=$PWD/.gpu/tokcache python3 benchmarks/probes/gap_probe.py --model dummy:llama-2-7b
    ... --batch 128 --prompt-len 512 --modes async     # the decode steps of serving at concurrency 128
    ... --batch 96 --prompt-len 256 --modes async --mixed-prompt-len 400   # serving's prefill steps
"""
from __future__ import annotations

import argparse
import collections
import itertools
import time
import traceback
import warnings
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from tritongen import LLM
from tritongen.bench.offline import fixed_length_params
from tritongen.bench.step_profile import device_gaps, host_breakdown, kernel_spans, kernel_table


def synchronizing_calls(step, steps: int) -> str:
    """Where the host waited for the device during `steps` steps (torch's sync debug mode), by the
    stack of tritongen frames above the call, most frequent first."""
    seen: collections.Counter = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1] if "tritongen" in f.filename or "probes" in f.filename]
        seen[" <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames[-4:]))] += 1

    with warnings.catch_warnings():  # restores showwarning and the filters on exit
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    lines = [f"    synchronizing calls over {steps} steps: {sum(seen.values())}"]
    lines += [f"      {n:4d}x {where}" for where, n in seen.most_common(12)]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="dummy:llama-2-7b")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cuda", help="cpu only checks the script (tiny model, nothing to see)")
    ap.add_argument("--quantization", default=None, help="e.g. fp8")
    ap.add_argument("--modes", default="async,pipelined,sequential", help="engine loops to profile, comma list")
    ap.add_argument("--batch", type=int, default=1, help="sequences decoding together")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--mixed-prompt-len", type=int, default=0,
                    help="a new prompt of this many tokens joins every measured step (0: decode only)")
    ap.add_argument("--mixed-cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                    help="the engine option (on by default): capture mixed steps too")
    ap.add_argument("--sync-debug", action="store_true",
                    help="after the profile, run the steps again and list where the host blocked on the device")
    args = ap.parse_args()
    if args.device == "cpu":
        torch.cuda.synchronize = lambda: None  # noqa: E731 - a smoke run of the script
    llm = LLM(args.model, dtype="bfloat16" if args.device == "cuda" else "float32", device=args.device,
              quantization=args.quantization, max_num_seqs=max(256, args.batch),
              mixed_cuda_graphs=args.mixed_cuda_graphs)
    eng = llm.engine
    modes = {"async": (True, True), "pipelined": (True, False), "sequential": (False, False)}
    for name in args.modes.split(","):
        pipelined, async_ = modes[name]
        eng.pipelined, eng.async_scheduling = pipelined, async_
        most = 10 + -(-args.batch * args.prompt_len // 512)  # every prompt's prefill, in chunks of >= 512
        names = [f"{name}-{i}" for i in range(args.batch)]
        for i, rid in enumerate(names):
            eng.add_request(rid, [100 + (i + j) % 1000 for j in range(args.prompt_len)],
                            fixed_length_params(4 * args.steps + 30 + most))
        for _ in range(most):  # until every prompt is prefilled, then 10 decode steps
            eng.step()
            if all(eng.scheduler.requests[rid].num_output_tokens >= 10 for rid in names):
                break
        mixed = itertools.count()

        def step() -> None:
            if args.mixed_prompt_len:
                k = next(mixed)
                eng.add_request(f"{name}-mix-{k}", [200 + (k + j) % 1000 for j in range(args.mixed_prompt_len)],
                                fixed_length_params(1))
            eng.step()

        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / args.steps * 1e3
        context = sum(eng.scheduler.requests[rid].num_tokens for rid in names) / len(names)
        with profile(activities=[ProfilerActivity.CUDA if args.device == "cuda" else ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
        spans = kernel_spans(prof)
        g = device_gaps(spans, args.steps)
        breakdown = host_breakdown(eng, args.steps, step)
        if args.sync_debug and args.device == "cuda":
            print(synchronizing_calls(step, args.steps), flush=True)
        for rid in names:
            eng.abort(rid)
        while eng.has_unfinished():
            eng.step()
        mix = f", a {args.mixed_prompt_len}-token prompt joining each step" if args.mixed_prompt_len else ""
        print(f"{name:10s} {len(names)} sequences, mean context {context:.0f} tokens at the profile's start{mix}",
              flush=True)
        print(f"{name:10s} wall {wall:.3f} ms/step | kernels {g['kernels_per_step']:.0f}/step busy {g['busy_ms']:.3f} ms"
              f" | gaps <5us {g['gap_lt5us_ms']:.3f} ms, 5-50us {g['gap_5_50us_ms']:.3f} ms, >=50us "
              f"{g['gap_ge50us_ms']:.3f} ms ({g['large_gaps_per_step']:.1f}/step)", flush=True)
        for (a, b), us in g["top_large"]:
            print(f"    large gaps {us / args.steps:8.1f} us/step after {a!r} before {b!r}")
        print(breakdown, flush=True)
        print(kernel_table(spans, args.steps), flush=True)
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
