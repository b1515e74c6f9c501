"""Fault injection on a real `tritongen serve --frontend triton` (tiny model, CPU), its own server:
kill -9 of the engine model's stub with requests in flight, kill -9 of the BLS front's stub, then
SIGTERM with requests in flight.

The tests share one server, in order: the first two kill a stub and wait for the supervisor's
restart, the last stops the restarted server.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "triton"))  # triton_helpers

from triton_helpers import free_ports, grpc_inputs, port_is_free, text  # noqa: E402

from tritongen.triton import launcher  # noqa: E402

RECOVERY_S = float(os.environ.get("TRITONGEN_TEST_RECOVERY_TIMEOUT", "60"))
LONG = {"max_tokens": 3000, "ignore_eos": True}  # runs far longer than any test step


class Serve:
    def __init__(self, tmp: Path) -> None:
        self.http, self.grpc, self.metrics = free_ports(3)
        self.log_path = tmp / "serve.log"
        self.log = open(self.log_path, "w")
        env = {**os.environ, "PYTHONPATH": str(Path(launcher.__file__).resolve().parents[2])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tritongen.cli", "serve", "--model", "dummy:tiny-llama", "--dtype", "float32",
             "--device", "cpu", "--num-blocks", "256", "--max-num-seqs", "16", "--http-port", str(self.http),
             "--grpc-port", str(self.grpc), "--metrics-port", str(self.metrics), "--repo-dir", str(tmp / "repo")],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, words: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while words not in self.output():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.output()[-3000:]
            time.sleep(0.25)

    def server_pid(self) -> int:
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    exe = f.read().split(b"\0")[0]
            except (OSError, ValueError, IndexError):
                continue
            if ppid == self.proc.pid and exe.endswith(b"tritonserver"):
                return int(entry)
        raise AssertionError("no tritonserver child of tritongen serve")

    def stub(self, model: str = "llm") -> launcher.StubProcess:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            stubs = [s for s in launcher.find_stubs(self.server_pid()) if s.model == model and not s.zombie]
            if stubs:
                return stubs[0]
            time.sleep(0.1)
        raise AssertionError(f"no live stub of {model}")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    if not launcher.has_tritonserver():
        pytest.skip("no tritonserver")
    s = Serve(tmp_path_factory.mktemp("faults"))
    try:
        s.wait_for("Triton is ready", float(os.environ.get("TRITONGEN_TEST_READY_TIMEOUT", "300")))
        yield s
    finally:
        if s.proc.poll() is None:
            s.proc.send_signal(signal.SIGINT)
            try:
                s.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                s.proc.kill()
        s.log.close()


class InFlight:
    """One gRPC stream to llm and one SSE generate_stream, each started and seen producing tokens;
    `outcomes` gets (kind, seconds since `t0`, what ended it)."""

    def __init__(self, serve: Serve) -> None:
        self.serve = serve
        self.outcomes: "queue.Queue" = queue.Queue()
        self.started = threading.Barrier(3, timeout=60)
        self.t0 = 0.0
        for target in (self._grpc, self._sse):
            threading.Thread(target=target, daemon=True).start()
        self.started.wait()

    def _end(self, kind: str, how) -> None:
        self.outcomes.put((kind, time.monotonic() - self.t0, how))

    def _grpc(self) -> None:
        import tritonclient.grpc as grpcclient

        q: "queue.Queue" = queue.Queue()
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{self.serve.grpc}")
        client.start_stream(callback=lambda result, error: q.put(error))
        inputs = {"text_input": text("hi"), "max_tokens": np.array([LONG["max_tokens"]], np.int32),
                  "ignore_eos": np.array([True]), "stream": np.array([True])}
        client.async_stream_infer("llm", grpc_inputs(inputs))
        first = q.get(timeout=60)
        assert first is None, first
        self.started.wait()
        while True:
            error = q.get(timeout=120)
            if error is not None:
                self._end("grpc", error.status())
                break
        client.close()

    def _sse(self) -> None:
        body = json.dumps({"text_input": "hi", "stream": True, **LONG}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.serve.http}/v2/models/llm/generate_stream", data=body)
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                resp.readline()
                self.started.wait()
                for _ in resp:
                    pass
            self._end("sse", "closed")
        except Exception as exc:  # noqa: BLE001  (the connection's end is what we record)
            self._end("sse", type(exc).__name__)

    def ended(self, timeout: float) -> dict:
        out = {}
        deadline = time.monotonic() + timeout
        while len(out) < 2:
            kind, at, how = self.outcomes.get(timeout=max(0.01, deadline - time.monotonic()))
            out[kind] = (at, how)
        return out



def test_dead_engine_stub_fails_in_flight_and_comes_back(serve):
    """Issue 21 item 4: kill -9 of llm's stub → in-flight requests end within 5 s (gRPC: UNAVAILABLE),
    the server is not ready while down, and it serves again within RECOVERY_S with no operator."""
    stub = serve.stub()
    flight = InFlight(serve)
    flight.t0 = time.monotonic()
    os.kill(stub.pid, signal.SIGKILL)
    ended = flight.ended(timeout=5)
    assert ended["grpc"][1].endswith("UNAVAILABLE"), ended
    assert ended["sse"][0] < 5, ended
    deadline = time.monotonic() + 5
    while serve.ready():
        assert time.monotonic() < deadline, "still ready 5 s after the engine's stub died"
        time.sleep(0.1)
    serve.wait_for("back in service", RECOVERY_S)
    assert serve.ready() and serve.stub().pid != stub.pid
    assert f"(pid {stub.pid}) died" in serve.output()
    req = urllib.request.Request(f"http://127.0.0.1:{serve.http}/v2/models/llm_bls/generate",
                                 data=json.dumps({"text_input": "hi", "max_tokens": 4}).encode())
    assert json.loads(urllib.request.urlopen(req, timeout=60).read())["text_output"]


def test_crashed_bls_stub_leaves_its_stacks_and_brings_a_restart(serve):
    """A crashed forwarding model's stub (llm_bls) is a death too: python_backend 24.10 would leave
    every later llm_bls request failing ("Stub process 'llm_bls_0_0' is not healthy.") while the
    model stays ready. Its Python stacks are in the log, the supervisor restarts the server, and
    llm_bls serves again."""
    serve.wait_for("back in service", RECOVERY_S)  # the previous test's restart
    stub = serve.stub("llm_bls")
    os.kill(stub.pid, signal.SIGSEGV)
    serve.wait_for("the stub process of model 'llm_bls'", 10)
    assert "Fatal Python error: Segmentation fault" in serve.output()  # model.py's faulthandler: the stacks
    deadline = time.monotonic() + RECOVERY_S
    while serve.output().count("back in service") < 2:
        assert serve.proc.poll() is None and time.monotonic() < deadline, serve.output()[-3000:]
        time.sleep(0.25)
    assert serve.stub("llm_bls").pid != stub.pid
    req = urllib.request.Request(f"http://127.0.0.1:{serve.http}/v2/models/llm_bls/generate",
                                 data=json.dumps({"text_input": "hi", "max_tokens": 4}).encode())
    assert json.loads(urllib.request.urlopen(req, timeout=60).read())["text_output"]


def test_sigterm_with_requests_in_flight_leaves_nothing(serve):
    """Issue 21 item 6: SIGTERM with requests in flight → exit 0 within the exit timeout (+ our 5 s
    grace), no stub of this server alive, none of their /dev/shm regions, the ports free."""
    server_pid = serve.server_pid()
    stubs = launcher.find_stubs(server_pid)
    assert {s.model for s in stubs} >= {"llm", "llm_bls"}
    flight = InFlight(serve)
    flight.t0 = time.monotonic()
    serve.proc.send_signal(signal.SIGTERM)
    assert serve.proc.wait(timeout=10 + 5 + 10) == 0
    assert time.monotonic() - flight.t0 < 10 + 5 + 5
    assert flight.ended(timeout=1)  # no client left hanging
    assert launcher.find_stubs(server_pid) == []
    for stub in stubs:
        assert not Path(f"/proc/{stub.pid}").exists() or launcher._read_stub(stub.pid) is None
        assert not (launcher.SHM_DIR / stub.shm_region).exists(), stub.shm_region
    for port in (serve.http, serve.grpc, serve.metrics):
        assert port_is_free(port)
