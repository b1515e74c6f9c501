"""One real tritonserver (from the nvidia-pytriton wheel) for the whole session, on free ports bound
to 127.0.0.1, CPU, tiny model; stopped by PID at the end with its ports checked free."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # triton_helpers, fake_pb_utils (pytest runs in importlib mode)

from triton_helpers import TINY, free_ports, stop_and_check  # noqa: E402


def triton_available() -> bool:
    try:
        from tritongen.triton.launcher import find_tritonserver

        find_tritonserver()
        import tritonclient.grpc  # noqa: F401
        import tritonclient.http  # noqa: F401
    except (FileNotFoundError, ImportError):
        return False
    return True


@dataclass
class Served:
    server: object
    repo: Path
    http: str
    grpc: str
    metrics: str


@pytest.fixture(scope="session")
def triton(tmp_path_factory, default_model_dir) -> Served:  # the tiny model speaks its tokenizer
    if not triton_available():
        pytest.skip("tritonserver (nvidia-pytriton) or tritonclient is not installed")
    from tritongen.triton.launcher import TritonServer
    from tritongen.triton.repo import write_repository

    root = tmp_path_factory.mktemp("triton")
    repo = write_repository(root / "repo", TINY, layout="ensemble")
    http, grpc, metrics = free_ports(3)
    server = TritonServer(repo, http_port=http, grpc_port=grpc, metrics_port=metrics, log_file=root / "server.log",
                          model_control="explicit", load_models=["*"], exit_timeout_s=30)
    server.start()
    try:
        server.wait_ready(timeout=float(os.environ.get("TRITONGEN_TEST_READY_TIMEOUT", "300")))
        yield Served(server, repo, server.http_url, server.grpc_url, server.metrics_url)
    finally:
        stop_and_check(server, repo, (http, grpc, metrics))


@pytest.fixture(scope="session")
def reference_llm():
    """The served tiny model in process: greedy output through Triton must equal this."""
    from tritongen import LLM

    return LLM(**TINY)


@pytest.fixture(autouse=True)
def stubs_survive(request):
    """After every test on the session server: no model that Triton still calls ready has lost its
    stub. python_backend 24.10 leaves such a model ready and failing every request ("Stub process
    ... is not healthy."), so every later test of it would fail too; this fails the test that killed
    it, with the stub's last words from the server log (model.py's faulthandler writes its stacks)."""
    if "triton" not in request.fixturenames:
        yield
        return
    served = request.getfixturevalue("triton")
    before = {s.model for s in served.server.poll_stubs() if not s.zombie}
    yield
    after = {s.model for s in served.server.poll_stubs() if not s.zombie}
    dead = sorted(m for m in before - after if served.server.is_ready(m))
    if dead:
        pytest.fail(f"the stub process of {', '.join(dead)} died during this test; the server log says:\n"
                    f"{served.server.crash_excerpt()}", pytrace=False)

