"""Diagnose tensor-parallel start-up and shutdown on a multi-GPU machine: timestamps for each phase
and Python stacks of anything that takes longer than 10 s.

    PYTHONPATH=$PWD/src TRITONGEN_CACHE=$PWD/.gpu/tokcache python3 benchmarks/tp_teardown_check.py
"""
from __future__ import annotations

import faulthandler
import sys
import time

import torch
import torch.distributed.distributed_c10d as c10d

from tritongen import LLM, SamplingParams

t0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"+{time.perf_counter() - t0:6.2f}s {msg}", flush=True)


log(f"torch {torch.__version__}, {torch.cuda.device_count()} GPUs, abort api {hasattr(c10d, '_abort_process_group')}")
faulthandler.dump_traceback_later(10, repeat=True, file=sys.stdout)
for round_ in range(2):  # twice: a second engine in the same process needs a clean group
    llm = LLM("dummy:tiny-llama", tensor_parallel_size=2, dtype="float32", num_blocks=256,
              enforce_eager=len(sys.argv) > 1)
    log(f"round {round_}: engine up, workers {llm.engine.runner.worker_pids}")
    out = llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=8, temperature=0))
    log(f"round {round_}: generated {out[0].token_ids}")
    llm.shutdown()
    log(f"round {round_}: shut down")
faulthandler.cancel_dump_traceback_later()
log("done")
