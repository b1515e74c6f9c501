"""Rank 0 of a tensor-parallel engine: starts ranks 1..N-1 as worker processes and drives them.

The engine (scheduler, detokenizer) exists once, in the caller's process, which is rank 0. Each
step, TensorParallelRunner sends every worker the step's compact message (worker.step_message),
then runs its own shard; the ranks meet only in the model's collectives, and only rank 0 samples.
Workers are fresh interpreters (`python -m tritongen.runner.tp_worker`, tritongen/processes.py) that
read pickled messages from an inherited pipe.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import subprocess
import threading
import weakref
from multiprocessing.connection import Connection
from typing import Any, Callable, Iterator

from tritongen.config import EngineConfig
from tritongen.netutil import free_ports
from tritongen.processes import end_process, spawn_module
from tritongen.runner.tp_worker import WorkerSpec, step_message, timeout
from tritongen.types import ModelOutput, SchedulerOutput

logger = logging.getLogger(__name__)

_JOIN_TIMEOUT_S = 10.0


def check_tensor_parallel(config: EngineConfig, model_path: str) -> str:
    """The torch.distributed backend for this config; ValueError naming what makes it impossible."""
    import torch
    import torch.distributed as dist

    from tritongen.models.loader import read_arch
    from tritongen.parallel.tensor_parallel import validate_tensor_parallel
    from tritongen.runner.model_runner import resolve_device

    n = config.parallel.tensor_parallel_size
    validate_tensor_parallel(read_arch(model_path), n)
    device = resolve_device(config.model.device)
    if device.type == "cuda":
        if device.index not in (None, 0):
            raise ValueError(f"tensor parallelism uses cuda:0..{n - 1} of the visible GPUs; pass device "
                             f"'cuda' and choose GPUs with CUDA_VISIBLE_DEVICES instead of {config.model.device!r}")
        visible = torch.cuda.device_count()
        if n > visible:
            raise ValueError(f"tensor_parallel_size {n} is larger than the {visible} visible GPU(s)")
        if not dist.is_nccl_available():
            raise ValueError("tensor parallelism on CUDA needs torch.distributed with NCCL")
        return "nccl"
    if not dist.is_gloo_available():
        raise ValueError(f"tensor_parallel_size {n} on CPU needs torch.distributed with the gloo backend, "
                         "which this torch build lacks")
    return "gloo"


class WorkerLostError(RuntimeError):
    """A tensor-parallel worker died: no later step can run (the AsyncLLM engine stops at once)."""

    fatal = True


class _Workers:
    """The worker processes and their pipes; stop() is idempotent and also runs at exit/GC."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.conns: list[Connection] = []

    def start(self, spec: WorkerSpec) -> None:
        read_fd, write_fd = os.pipe()
        try:
            proc = spawn_module("tritongen.runner.tp_worker", read_fd)
        finally:
            os.close(read_fd)
        conn = Connection(write_fd, readable=False)
        self.procs.append(proc)
        self.conns.append(conn)
        conn.send(spec)

    def check(self) -> None:
        for rank, proc in enumerate(self.procs, start=1):
            if proc.poll() is not None:
                raise WorkerLostError(f"tensor parallel worker rank {rank} (pid {proc.pid}) exited with code "
                                   f"{proc.returncode}; the engine cannot run steps any more")

    def send(self, msg: Any) -> None:
        for rank, conn in enumerate(self.conns, start=1):
            try:
                conn.send(msg)
            except (BrokenPipeError, ConnectionError, OSError) as exc:
                raise WorkerLostError(f"tensor parallel worker rank {rank} is gone ({exc})") from exc

    def stop(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except Exception:  # already gone
                pass
            conn.close()
        for proc in self.procs:
            end_process(proc, _JOIN_TIMEOUT_S)
        self.procs, self.conns = [], []


def _leave_group() -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if not dist.is_initialized():
        return
    if dist.get_backend() == "nccl" and hasattr(c10d, "_abort_process_group"):
        c10d._abort_process_group()  # the workers are gone: a graceful NCCL finalize would wait for them
    else:
        dist.destroy_process_group()


def _stop(workers: _Workers) -> None:
    workers.stop()
    # Bounded: leaving the group must never hang the caller (a server's unload, an interpreter exit).
    done = threading.Event()

    def leave() -> None:
        try:
            _leave_group()
        except Exception:
            logger.exception("leaving the tensor parallel process group failed")
        done.set()

    threading.Thread(target=leave, name="tritongen-tp-leave", daemon=True).start()
    if not done.wait(_JOIN_TIMEOUT_S):
        logger.warning("leaving the tensor parallel process group took over %.0f s; going on without it "
                       "(a new tensor-parallel engine in this process will be refused)", _JOIN_TIMEOUT_S)


class TensorParallelRunner:
    """RunnerLike for tensor_parallel_size > 1: rank 0's ModelRunner plus the worker processes."""

    def __init__(self, config: EngineConfig, model_path: str) -> None:
        import torch.distributed as dist

        from tritongen.parallel.tensor_parallel import Shard
        from tritongen.runner.model_runner import ModelRunner

        n = config.parallel.tensor_parallel_size
        backend = check_tensor_parallel(config, model_path)
        if dist.is_initialized():
            raise RuntimeError("torch.distributed is already initialized in this process: one "
                               "tensor-parallel engine per process")
        init_method = f"tcp://127.0.0.1:{free_ports(1)[0]}"
        self._workers = _Workers()
        self._finalizer = weakref.finalize(self, _stop, self._workers)
        try:
            for rank in range(1, n):
                self._workers.start(WorkerSpec(rank, n, backend, init_method, config, model_path, os.getpid()))
            dist.init_process_group(backend, init_method=init_method, rank=0, world_size=n,
                                    timeout=timeout(config.parallel))
            shard = Shard(0, n, config=config.parallel)
            self.runner = ModelRunner(config.model, config.cache, config.scheduler, model_path, shard=shard,
                                      driver=True)
        except BaseException:
            self.shutdown()
            raise
        self.num_blocks, self.block_size, self.arch = self.runner.num_blocks, self.runner.block_size, self.runner.arch
        logger.info("tensor parallel: %d ranks (%s), worker pids %s", n, backend, self.worker_pids)

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._workers.procs]

    @property
    def asynchronous(self) -> bool:
        return self.runner.asynchronous

    @property
    def supports_input_from_previous(self) -> bool:
        return self.runner.supports_input_from_previous  # rank 0 broadcasts the ids it sampled

    def execute(self, sched: SchedulerOutput) -> ModelOutput:
        return self.launch(sched)()

    def launch(self, sched: SchedulerOutput) -> Callable[[], ModelOutput]:
        self._workers.check()
        if not sched.is_empty:  # an empty step only lets rank 0 drop per-request sampler state
            self._workers.send(step_message(sched))
        with self._explain_failure():
            result = self.runner.launch(sched)

        def finish() -> ModelOutput:
            with self._explain_failure():
                return result()

        return finish

    @contextlib.contextmanager
    def _explain_failure(self) -> Iterator[None]:
        """A dead worker is the better explanation of a failed collective; give it a moment to be reaped."""
        try:
            yield
        except Exception:
            for proc in self._workers.procs:
                try:
                    proc.wait(1.0)
                except subprocess.TimeoutExpired:
                    pass
            self._workers.check()
            raise

    def shutdown(self) -> None:
        """Stop the workers (each exits its loop) and leave the process group."""
        runner = getattr(self, "runner", None)
        if runner is not None and runner.graphs is not None:
            # Graphs that captured NCCL kernels hold the communicator: an abort waits for them (seen
            # on the 2xH200), so they go first.
            import torch

            runner.graphs = None
            gc.collect()
            torch.cuda.synchronize(runner.device)
        self._finalizer()
