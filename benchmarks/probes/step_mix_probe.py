"""The steps that serving makes, without a GPU: a closed loop of `--concurrency` clients sends the
sharegpt-like requests (`tritongen bench serve`'s lengths, `ignore_eos`) through the real scheduler
and a tiny model on the CPU, and each step is classed as a decode step, a step with prompt tokens
that a mixed-step CUDA graph could replay (`--mixed-cuda-graphs`: runner/mixed_graph.eager_reason
with this engine's limits), or one that would run eagerly, and why. It prints the share of each,
the tokens of the steps with prompt tokens (their GPU time grows with them) and the rows a graph
pads them with.

The CPU engine is synchronous, where the CUDA one schedules a step ahead, so the mix is the
scheduler's policy, not a GPU run's exact sequence of steps.

    PYTHONPATH=$PWD/src python3 benchmarks/probes/step_mix_probe.py --num-prompts 1000 --concurrency 128
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time

from tritongen import LLM, SamplingParams
from tritongen.bench.datasets import sharegpt_like_lengths
from tritongen.runner.mixed_graph import eager_reason, token_buckets
from tritongen.types import SchedulerOutput


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--block-size", type=int, default=16)
    args = ap.parse_args()

    llm = LLM("dummy:tiny-llama", device="cpu", block_size=args.block_size, num_blocks=60_000,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              max_model_len=args.max_model_len)
    engine, width = llm.engine, -(-args.max_model_len // args.block_size)
    buckets = token_buckets(args.max_num_batched_tokens)
    kinds: collections.Counter = collections.Counter()
    mixed: list[tuple[int, int, int]] = []  # (tokens, prompts, sequences) of each step with prompt tokens
    execute = engine.runner.execute

    def classify(sched: SchedulerOutput):
        seqs = sched.seqs
        if seqs:
            tokens = sched.num_batched_tokens
            if sched.carries_prompt_tokens:  # what the engine counts as a step with prompt tokens
                reason = eager_reason(seqs, tokens, buckets[-1], args.max_num_seqs, width)
                kinds[f"prompt tokens, eager: {reason}" if reason else "prompt tokens, graph"] += 1
                mixed.append((tokens, sum(1 for s in seqs if s.num_new_tokens > 1), len(seqs)))
            else:
                kinds["decode"] += 1
        return execute(sched)

    engine.runner.execute = classify
    todo = list(enumerate(sharegpt_like_lengths(args.num_prompts, args.seed)))[::-1]
    live, start = 0, time.perf_counter()
    while todo or engine.has_unfinished():
        while todo and live < args.concurrency:
            i, (p, o) = todo.pop()
            engine.add_request(f"r{i}", [5 + (i + k) % 1000 for k in range(p)],
                               SamplingParams(max_tokens=o, ignore_eos=True, temperature=0))
            live += 1
        live -= sum(out.finished for out in engine.step())
    steps = sum(kinds.values())
    print(f"{args.num_prompts} requests at concurrency {args.concurrency}: {steps} steps "
          f"({time.perf_counter() - start:.0f} s on the CPU)")
    for kind, n in kinds.most_common():
        print(f"  {kind:<60} {n:6d}  {100 * n / steps:5.1f} %")
    tokens = [t for t, _, _ in mixed]
    pads = [next(b for b in buckets if b >= t) - t for t in tokens if t <= buckets[-1]]
    print(f"steps with prompt tokens: tokens mean {statistics.mean(tokens):.0f}, p50 {statistics.median(tokens):.0f}, "
          f"max {max(tokens)}; prompts a step mean {statistics.mean(p for _, p, _ in mixed):.2f}; "
          f"sequences a step mean {statistics.mean(n for _, _, n in mixed):.1f}; "
          f"a graph's padding rows mean {statistics.mean(pads):.1f}")


if __name__ == "__main__":
    main()
