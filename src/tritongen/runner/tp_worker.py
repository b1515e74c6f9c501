"""Tensor-parallel ranks 1..N-1: a worker process that runs its shard of every step.

Rank 0 (the engine's process) schedules; each worker receives a compact copy of the step over a
pipe, runs the same forward pass (joining rank 0's collectives) and sends nothing back. A worker
ends when the pipe says stop or closes (rank 0 stopped or died), when its parent process goes
away, or when a step fails (rank 0's collective then fails too, and the engine reports it).
"""
from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection

from tritongen.config import EngineConfig, ParallelConfig
from tritongen.processes import exit_with_parent
from tritongen.types import SamplingParams, ScheduledSeq, SchedulerOutput

logger = logging.getLogger(__name__)

_NO_SAMPLING = SamplingParams(max_tokens=1)
"""Stands in for every request's sampling parameters: workers never sample."""


def step_message(sched: SchedulerOutput) -> SchedulerOutput:
    """What a worker needs of a step: the tokens, positions and block tables of its forward pass,
    and the prompt of requests that ask for prompt logprobs (their logits are computed on every rank)."""
    seqs = []
    for s in sched.seqs:
        k = s.params.prompt_logprobs
        params = _NO_SAMPLING if k is None else SamplingParams(max_tokens=1, prompt_logprobs=k)
        seqs.append(ScheduledSeq(s.request_id, s.token_ids, s.start_pos, s.block_table, s.do_sample, params,
                                 s.prompt_token_ids if k is not None else [], []))
    return SchedulerOutput(seqs, previous_rows=sched.previous_rows, num_previous=sched.num_previous)


def timeout(config: ParallelConfig) -> timedelta:
    """How long a collective (and start-up) waits for the other ranks."""
    return timedelta(seconds=config.tp_timeout_s)


@dataclass(frozen=True)
class WorkerSpec:
    """The first message a worker reads: who it is and what to load."""

    rank: int
    world_size: int
    backend: str
    init_method: str
    config: EngineConfig
    model_path: str
    parent_pid: int


def worker_main(conn: Connection) -> None:
    import torch
    import torch.distributed as dist

    from tritongen.parallel.tensor_parallel import Shard
    from tritongen.runner.model_runner import ModelRunner

    spec: WorkerSpec = conn.recv()
    rank, world_size, config = spec.rank, spec.world_size, spec.config
    logging.basicConfig(level=config.parallel.log_level or logging.INFO,
                        format=f"[tp rank {rank}] %(levelname)s %(name)s: %(message)s")
    exit_with_parent(spec.parent_pid)
    if spec.backend == "gloo":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))  # ranks share the cores
    try:
        dist.init_process_group(spec.backend, init_method=spec.init_method, rank=rank, world_size=world_size,
                                timeout=timeout(config.parallel))
        shard = Shard(rank, world_size, config=config.parallel)
        runner = ModelRunner(config.model, config.cache, config.scheduler, spec.model_path, shard=shard, driver=False)
        while True:
            try:
                msg = conn.recv()
            except EOFError:  # rank 0 closed the pipe or died
                break
            if msg is None:
                break
            runner.execute(msg)
    except BaseException:
        logger.exception("tensor parallel worker rank %d failed", rank)
        sys.stderr.flush()
        os._exit(1)  # no clean-up that could block on a dead peer
    # No destroy_process_group: NCCL's graceful finalize waits for every rank, and rank 0 aborts
    # its side only after the workers are gone. Exiting releases the GPU and the sockets.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

if __name__ == "__main__":
    worker_main(Connection(int(sys.argv[1]), writable=False))
