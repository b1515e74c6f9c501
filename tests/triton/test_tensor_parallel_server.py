"""Processes the `llm` model starts inside a real tritonserver (CPU): with tensor_parallel_size=2
(gloo) the stub is rank 0 and starts one worker process; with engine_process=true (the default on
CUDA) it starts the engine process, which is rank 0 and starts the worker. Greedy output equals the
in-process engine's, and the children go away on unload and on server exit (no orphans)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from proc_helpers import pid_alive, wait_until
from triton_helpers import TINY, free_ports, generate, http_post, stub_pids


def _children(pid: int, module: bytes = b"tritongen.runner.tp_worker") -> list[int]:
    """PIDs of the processes whose parent is `pid` and that run `module`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(") ", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and module in cmd:
            found.append(int(entry))
    return found


def _workers(repo, module: bytes = b"tritongen.runner.tp_worker") -> list[int]:
    return [w for stub in stub_pids(repo) for w in _children(stub, module)]


def test_llm_model_with_two_ranks(tmp_path, default_model_dir, reference_llm) -> None:
    from conftest import triton_available

    if not triton_available():
        pytest.skip("tritonserver (nvidia-pytriton) or tritonclient is not installed")
    from tritongen.triton.launcher import TritonServer
    from tritongen.triton.repo import write_repository
    from tritongen.types import SamplingParams

    repo = write_repository(tmp_path / "repo", {**TINY, "tensor_parallel_size": 2})
    http, grpc, metrics = free_ports(3)
    server = TritonServer(repo, http_port=http, grpc_port=grpc, metrics_port=metrics,
                          log_file=tmp_path / "server.log", model_control="explicit", load_models=["llm"],
                          exit_timeout_s=30)
    server.start()
    seen: list[int] = []
    try:
        server.wait_ready(timeout=300)
        workers = _workers(repo)
        assert len(workers) == 1, (tmp_path / "server.log").read_text()[-3000:]
        seen += workers
        prompt = "The quick brown fox"
        expected = reference_llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0.0))[0].text
        body = {"text_input": prompt, "max_tokens": 12, "temperature": 0.0, "exclude_input_in_output": True}
        assert generate(server.http_url, "llm", body)["text_output"] == expected

        status, raw = http_post(server.http_url, "/v2/repository/models/llm/unload", {})
        assert status == 200, raw
        assert wait_until(lambda: not any(pid_alive(w) for w in workers), 60), "worker outlived the unloaded model"

        status, raw = http_post(server.http_url, "/v2/repository/models/llm/load", {})
        assert status == 200, raw
        reloaded = _workers(repo)
        assert len(reloaded) == 1 and reloaded != workers
        seen += reloaded
        assert generate(server.http_url, "llm", body)["text_output"] == expected
    finally:
        server.stop()
    assert server.process.poll() is not None
    assert wait_until(lambda: not any(pid_alive(w) for w in seen), 30), "worker outlived tritonserver"


def test_llm_model_with_an_engine_process_and_two_ranks(tmp_path, default_model_dir, reference_llm) -> None:
    from conftest import triton_available

    if not triton_available():
        pytest.skip("tritonserver (nvidia-pytriton) or tritonclient is not installed")
    from triton_helpers import grpc_stream, text, texts
    from tritongen.triton.launcher import TritonServer
    from tritongen.triton.repo import write_repository
    from tritongen.types import SamplingParams

    module = b"tritongen.entrypoints.engine_process"
    repo = write_repository(tmp_path / "repo", {**TINY, "engine_process": True, "tensor_parallel_size": 2})
    http, grpc, metrics = free_ports(3)
    server = TritonServer(repo, http_port=http, grpc_port=grpc, metrics_port=metrics,
                          log_file=tmp_path / "server.log", model_control="explicit",
                          load_models=["llm", "llm_bls"], exit_timeout_s=30)
    server.start()
    try:
        server.wait_ready(timeout=300)
        children = _workers(repo, module)
        assert len(children) == 1, (tmp_path / "server.log").read_text()[-3000:]
        workers = _children(children[0])  # the engine process is rank 0 and starts rank 1
        assert len(workers) == 1, (tmp_path / "server.log").read_text()[-3000:]
        prompt = "The quick brown fox"
        expected = reference_llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0.0))[0].text
        body = {"text_input": prompt, "max_tokens": 12, "temperature": 0.0, "exclude_input_in_output": True}
        assert generate(server.http_url, "llm", body)["text_output"] == expected
        assert generate(server.http_url, "llm_bls", body)["text_output"] == expected
        results, finals = grpc_stream(server.grpc_url, "llm", {
            "text_input": text(prompt), "stream": np.array([True]),
            "sampling_parameters": text('{"max_tokens": 12, "temperature": 0}')})
        assert "".join(texts(results)) == expected and finals == 1

        status, raw = http_post(server.http_url, "/v2/repository/models/llm/unload", {})
        assert status == 200, raw
        assert wait_until(lambda: not any(pid_alive(c) for c in children + workers), 60), \
            "engine process or worker outlived the model"

        status, raw = http_post(server.http_url, "/v2/repository/models/llm/load", {})
        assert status == 200, raw
        children = _workers(repo, module)
        workers = [w for c in children for w in _children(c)]
        assert len(children) == 1 and len(workers) == 1
        assert generate(server.http_url, "llm", body)["text_output"] == expected
    finally:
        server.stop()
    assert server.process.poll() is not None
    assert wait_until(lambda: not any(pid_alive(c) for c in children + workers), 30), \
        "engine process or worker outlived tritonserver"
