"""Where a large decode step's time goes on rank 0, TP=1 against TP=N: wall per engine step, GPU busy
time, the share spent inside NCCL kernels (a rank waiting for the slower one), the device's idle
gaps (waiting for the host) and the host's time per phase (bench.step_profile's breakdown, plus the send of
the step message to the workers).

    PYTHONPATH=$PWD/src TRITONGEN_CACHE=$PWD/.gpu/tokcache python3 benchmarks/probes/tp_host_probe.py \
        --model dummy:llama-2-13b --tp 1,2 --batch 256
On CPU (gloo, tiny model) it only checks the code path: --device cpu.
"""
from __future__ import annotations

import argparse
import gc
import time
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from tritongen import LLM
from tritongen.bench.offline import fixed_length_params
from tritongen.bench.step_profile import device_gaps, host_breakdown, kernel_spans


def probe(args: argparse.Namespace, tp: int) -> str:
    on_gpu = args.device != "cpu"
    llm = LLM(args.model, dtype="bfloat16" if on_gpu else "float32", device=args.device, tensor_parallel_size=tp,
              max_num_seqs=args.batch, max_num_batched_tokens=max(8192, args.batch * 32),
              enable_prefix_caching=False)
    eng = llm.engine
    try:
        params = fixed_length_params(args.input_len + args.warm_steps + 3 * args.steps + 16)
        for i in range(args.batch):
            eng.add_request(f"r{i}", [100 + (i + j) % 1000 for j in range(args.input_len)], params)
        for _ in range(args.warm_steps):  # prefill everything, then settle into decode
            eng.step()
        sync = torch.cuda.synchronize
        sync()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            eng.step()
        sync()
        wall = (time.perf_counter() - t0) / args.steps * 1e3
        running = eng.stats()["num_running"]
        with profile(activities=[ProfilerActivity.CUDA if on_gpu else ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                eng.step()
            sync()
        kernels = kernel_spans(prof)
        g = device_gaps(kernels, args.steps)
        nccl = sum(e - s for s, e, n in kernels if "nccl" in n.lower()) / args.steps / 1e3
        breakdown = host_breakdown(eng, args.steps)
        return (f"TP={tp} batch {running}: wall {wall:.3f} ms/step | GPU busy {g['busy_ms']:.3f} ms, of which NCCL "
                f"{nccl:.3f} ms | idle gaps >=50us {g['gap_ge50us_ms']:.3f} ms ({g['large_gaps_per_step']:.1f}/step), "
                f"5-50us {g['gap_5_50us_ms']:.3f} ms, <5us {g['gap_lt5us_ms']:.3f} ms\n"
                f"{_top_kernels(kernels, args.steps, args.top)}\n{breakdown}")
    finally:
        llm.shutdown()
        del llm, eng
        gc.collect()


def _top_kernels(kernels, steps: int, top: int) -> str:
    """The `top` kernel names by device time per step (name cut to 70 characters)."""
    spent: Counter = Counter()
    count: Counter = Counter()
    for s, e, n in kernels:
        spent[n[:70]] += e - s
        count[n[:70]] += 1
    return "\n".join(f"    {us / steps:8.1f} us/step  {count[n] / steps:6.1f}/step  {n}"
                     for n, us in spent.most_common(top))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="dummy:llama-2-13b")
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--warm-steps", type=int, default=20)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--top", type=int, default=12, help="kernel names to list by device time per step")
    args = ap.parse_args()
    if args.device == "cpu":
        torch.cuda.synchronize = lambda: None  # noqa: E731 - a smoke run of the script (as gap_probe)
        args.model = "dummy:tiny-llama" if args.model == "dummy:llama-2-13b" else args.model
    for tp in (int(t) for t in args.tp.split(",")):
        print(probe(args, tp), flush=True)


if __name__ == "__main__":
    main()
