"""Host/device overlap of the engine loop, with the device simulated: a runner whose launch()
returns at once and whose wait() sleeps until `--device-ms` after the launch (what an H200 step
would take), while the host does the engine's real work (scheduler, block manager, the real
tokenizer's incremental detokenizer, outputs). Prints the step period of the sequential loop, of
the pipelined loop, and of the pipelined loop with asynchronous scheduling (the default on CUDA)
per batch size.

    PYTHONPATH=src python benchmarks/engine_overlap.py --batches 1,32,128 --device-ms 5,15
"""
from __future__ import annotations

import argparse
import random
import time

from tritongen.config import SchedulerConfig
from tritongen.core.engine import EngineCore, EngineLimits
from tritongen.types import ModelOutput, SamplingParams, SchedulerOutput


class SimulatedDevice:
    """num_blocks/block_size of a large cache; sampled ids are random text tokens."""

    def __init__(self, device_ms: float, mode: str, seed: int = 0) -> None:
        self.num_blocks, self.block_size = 100_000, 16
        self.device_s = device_ms / 1000
        self.asynchronous = mode != "sequential"
        self.supports_input_from_previous = mode == "async"
        self.rng = random.Random(seed)
        self.busy_until = 0.0

    def launch(self, sched: SchedulerOutput):
        start = max(time.perf_counter(), self.busy_until)  # the device runs steps one after another
        self.busy_until = end = start + self.device_s
        ids = [self.rng.randrange(1000, 30000) for s in sched.seqs if s.do_sample]

        def wait() -> ModelOutput:
            while time.perf_counter() < end:  # this step's end (a later launch may be queued); spin:
                pass                           # sleep() overshoots by ~1 ms
            return ModelOutput(ids)

        return wait

    def execute(self, sched: SchedulerOutput) -> ModelOutput:
        return self.launch(sched)()


def step_period_ms(tokenizer, decoder, batch: int, device_ms: float, mode: str, steps: int) -> float:
    runner = SimulatedDevice(device_ms, mode)
    limits = EngineLimits(max_model_len=100_000, vocab_size=49152, eos_token_ids=(0,))
    eng = EngineCore(runner, tokenizer, limits, SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=8192),
                     False, decoder=decoder)
    for i in range(batch):
        eng.add_request(f"r{i}", [random.randrange(1000, 30000) for _ in range(64)],
                        SamplingParams(max_tokens=steps + 50, ignore_eos=True, stop=["never-seen-stop"]))
    for _ in range(10):  # prefill and warm-up
        eng.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        eng.step()
    return (time.perf_counter() - t0) / steps * 1000


def main() -> None:
    from tritongen.fetch import resolve_model
    from tritongen.tokenizer import FastDecoder, load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--device-ms", default="5,15", help="simulated device time per step, comma-separated")
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    tokenizer = load_tokenizer(resolve_model(None))
    decoder = FastDecoder(tokenizer)
    modes = ("sequential", "pipelined", "async")
    print(f"{'batch':>6} {'device ms':>10} " + " ".join(f"{m + ' ms':>14}" for m in modes) + f" {'hidden by async':>16}")
    for batch in (int(b) for b in args.batches.split(",")):
        for dev in (float(d) for d in args.device_ms.split(",")):
            ms = [step_period_ms(tokenizer, decoder, batch, dev, m, args.steps) for m in modes]
            print(f"{batch:>6} {dev:>10.1f} " + " ".join(f"{v:>14.3f}" for v in ms) + f" {ms[0] - ms[2]:>16.3f}",
                  flush=True)

if __name__ == "__main__":
    main()
