"""Decode throughput of LLM.generate at batch 1 and batch 32 (prints tokens/s; not a test).

    python benchmarks/engine_throughput.py [--model PATH|dummy:...] [--device cpu] [--dtype float32]
"""
from __future__ import annotations

import argparse
import time

from tritongen import LLM, SamplingParams


def measure(llm: LLM, batch: int, input_len: int, output_len: int) -> tuple[float, float]:
    prompts = [[(17 * i + 31 * j) % 30000 + 100 for j in range(input_len)] for i in range(batch)]
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    dt = time.perf_counter() - t0
    n = sum(len(o.token_ids) for o in outs)
    return n / dt, dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--batches", default="1,32")
    args = ap.parse_args()
    llm = LLM(args.model, device=args.device, dtype=args.dtype, enable_prefix_caching=False)
    print(f"model={args.model or 'default'} device={args.device} dtype={args.dtype} "
          f"in={args.input_len} out={args.output_len}")
    print(f"{'batch':>5} {'tok/s':>9} {'seconds':>8}")
    for b in (int(x) for x in args.batches.split(",")):
        tps, dt = measure(llm, b, args.input_len, args.output_len)
        print(f"{b:>5} {tps:>9.1f} {dt:>8.2f}")


if __name__ == "__main__":
    main()
