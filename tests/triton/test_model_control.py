"""Model control and versions: `tritongen serve --model-control-mode explicit --load-model ...`,
`--version-policy`, and the forwarding models answering UNAVAILABLE while the engine model is not
loaded. One `tritongen serve` (tiny model, CPU) for the module."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from triton_helpers import free_ports, grpc_inputs, http_post, port_is_free, text
from tritongen.triton import commands, launcher
from tritongen.triton.pbtxt import version_policy
from tritongen.triton.repo import write_repository

TINY_ARGS = ["--model", "dummy:tiny-llama", "--dtype", "float32", "--device", "cpu", "--num-blocks", "64"]
TINY = {"model": "dummy:tiny-llama", "dtype": "float32", "device": "cpu", "num_blocks": 64}
SRC = str(Path(launcher.__file__).resolve().parents[2])


def test_version_policy_text():
    assert version_policy(None) == ""
    assert version_policy("all") == "version_policy: { all { } }\n"
    assert version_policy("latest:2") == "version_policy: { latest { num_versions: 2 } }\n"
    assert version_policy("specific:1,3") == "version_policy: { specific { versions: [ 1, 3 ] } }\n"
    for bad in ("latest:0", "specific:", "specific:a", "newest", "specific:0"):
        with pytest.raises(ValueError, match="version policy must be"):
            version_policy(bad)


def test_repo_cli_version_policy(tmp_path, capsys):
    from tritongen.cli import main

    assert main(["repo", "--out", str(tmp_path), "--version-policy", "specific:1,3", *TINY_ARGS]) == 0
    for model in ("llm", "llm_bls", "fastertransformer"):
        assert "version_policy: { specific { versions: [ 1, 3 ] } }" in (tmp_path / model / "config.pbtxt").read_text()
    assert main(["repo", "--out", str(tmp_path / "bad"), "--version-policy", "latest", *TINY_ARGS]) == 2
    assert "version policy must be" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_model_control_command_lines(tmp_path):
    assert "--repository-poll-secs=15" in launcher.TritonServer(tmp_path, model_control="poll").command(
        launcher.TritonInstall(Path("tritonserver")), None)
    with pytest.raises(commands.ServeError, match="--load-model needs --model-control-mode explicit"):
        commands.check_model_control("none", ["llm"])
    commands.check_model_control("explicit", ["llm"])
    commands.check_model_control("poll", None)
    with pytest.raises(commands.ServeError, match="--version-policy: version policy must be"):
        commands.check_version_policy("latest:x")


@pytest.fixture(scope="module")
def served(tmp_path_factory, default_model_dir):  # the tiny model speaks its tokenizer
    try:
        launcher.find_tritonserver()
    except FileNotFoundError:
        pytest.skip("no tritonserver")
    root = tmp_path_factory.mktemp("control")
    http, grpc, metrics = free_ports(3)
    log = open(root / "serve.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "tritongen.cli", "serve", "--http-port", str(http),
                             "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--repo-dir",
                             str(root / "repo"), "--model-control-mode", "explicit", "--load-model", "llm_bls",
                             "--version-policy", "all", *TINY_ARGS],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": SRC})
    try:
        deadline = time.monotonic() + 300
        while "Triton is ready" not in (root / "serve.log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (root / "serve.log").read_text()[-3000:]
            time.sleep(0.5)
        yield root / "repo", f"127.0.0.1:{http}", f"127.0.0.1:{grpc}"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        log.close()
    assert code == 0, (root / "serve.log").read_text()[-3000:]
    for port in (http, grpc, metrics):
        assert port_is_free(port)


def _clients(http, grpc):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(http), grpcclient.InferenceServerClient(grpc)


def _assert_unavailable(http, grpc):
    from tritonclient.utils import InferenceServerException

    _, g = _clients(http, grpc)
    with pytest.raises(InferenceServerException) as info:
        g.infer("llm_bls", grpc_inputs({"text_input": text("x")}))
    assert info.value.status() == "StatusCode.UNAVAILABLE" and "'llm' is not ready" in info.value.message()
    status, raw = http_post(http, "/v2/models/llm_bls/infer", {"inputs": [
        {"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["x"]}]})
    assert status == 503, raw  # (/generate answers every error 400 on tritonserver 2.51)


def _wait(predicate, timeout=60):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_explicit_load_only_the_front_then_the_engine(served):
    repo, http, grpc = served
    h, g = _clients(http, grpc)
    assert h.is_model_ready("llm_bls") and not h.is_model_ready("llm")
    assert not h.is_model_ready("fastertransformer")  # --load-model loads only what it names
    _assert_unavailable(http, grpc)
    g.load_model("llm")
    out = g.infer("llm_bls", grpc_inputs({"text_input": text("hello"), "max_tokens": np.array([3], np.int32)}))
    assert out.as_numpy("text_output")[0]
    g.unload_model("llm")
    _wait(lambda: not h.is_model_ready("llm"))
    _assert_unavailable(http, grpc)


def test_version_policy_picks_the_versions_served(served):
    repo, http, grpc = served
    h, _ = _clients(http, grpc)
    write_repository(repo, TINY, version=2, policy="all")
    h.load_model("llm_bls")
    assert h.is_model_ready("llm_bls", "1") and h.is_model_ready("llm_bls", "2")
    write_repository(repo, TINY, version=2, policy="specific:1")
    h.load_model("llm_bls")
    assert h.is_model_ready("llm_bls", "1") and not h.is_model_ready("llm_bls", "2")
    write_repository(repo, TINY, version=2, policy="latest:1")
    h.load_model("llm_bls")
    assert h.is_model_ready("llm_bls", "2") and not h.is_model_ready("llm_bls", "1")
    meta = json.loads(json.dumps(h.get_model_metadata("llm_bls")))
    assert meta["versions"] == ["2"]
