"""Repository builder, `tritongen repo`, launcher helpers (no server), and `tritongen serve` end to end."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tritongen.triton import launcher
from tritongen.triton.repo import engine_kwargs_from_config, engine_parameters, write_repository


def test_repo_cli_writes_thin_models_and_parameters(tmp_path):
    from tritongen.cli import main

    assert main(["repo", "--model", "dummy:tiny-llama", "--out", str(tmp_path), "--layout", "ensemble",
                 "--max-num-seqs", "8", "--no-enable-prefix-caching"]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["ensemble", "llm", "llm_bls", "llm_tokens", "postprocessing", "preprocessing"]
    config = (tmp_path / "llm" / "config.pbtxt").read_text()
    assert "decoupled: true" in config and 'key: "max_num_seqs" value: { string_value: "8" }' in config
    assert 'key: "enable_prefix_caching" value: { string_value: "false" }' in config
    body = (tmp_path / "llm" / "1" / "model.py").read_text()
    assert "from tritongen.triton.llm_model import TritonPythonModel" in body and len(body.splitlines()) <= 3
    assert "decoupled" not in (tmp_path / "llm_bls" / "config.pbtxt").read_text()
    assert not (tmp_path / "ensemble" / "1" / "model.py").exists()


def test_engine_options_round_trip():
    options = {"model": "dummy:tiny-llama", "num_blocks": 64, "kv_cache_memory_gb": 0.5,
               "enable_prefix_caching": False, "max_model_len": None}
    params = {k: {"string_value": v} for k, v in engine_parameters(options).items()}
    assert engine_kwargs_from_config({**params, "llm_model": {"string_value": "x"}}) == \
        {"model": "dummy:tiny-llama", "num_blocks": 64, "kv_cache_memory_gb": 0.5, "enable_prefix_caching": False}
    with pytest.raises(ValueError, match="unknown engine options"):
        engine_parameters({"nope": 1})
    with pytest.raises(ValueError, match="num_blocks"):
        engine_kwargs_from_config({"num_blocks": {"string_value": "many"}})


def test_second_version_keeps_the_first(tmp_path):
    write_repository(tmp_path, {"model": "dummy:tiny-llama"})
    write_repository(tmp_path, {"model": "dummy:tiny-llama"}, version=2)
    assert (tmp_path / "llm" / "1" / "model.py").exists() and (tmp_path / "llm" / "2" / "model.py").exists()


def test_backend_dir_and_environment(tmp_path):
    try:
        install = launcher.find_tritonserver()
    except FileNotFoundError:
        pytest.skip("no tritonserver")
    assert os.access(install.binary, os.X_OK)
    backend = launcher.prepare_backend_dir(install, tmp_path)
    if backend is not None:
        stub = tmp_path / "python" / "triton_python_backend_stub"
        assert os.access(stub, os.X_OK) and (tmp_path / "python" / "libtriton_python.so").exists()
    env = launcher.server_env(install, {"PATH": "/usr/bin"})
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    src = str(Path(launcher.__file__).resolve().parents[2])
    assert env["PYTHONPATH"].split(os.pathsep)[0] == src


def test_serve_command_end_to_end(tmp_path, default_model_dir):
    """`tritongen serve` with the default model (SmolLM2): ready, answers, stops on SIGINT."""
    try:
        launcher.find_tritonserver()
    except FileNotFoundError:
        pytest.skip("no tritonserver")
    import json
    import urllib.request

    from triton_helpers import free_ports, port_is_free

    http, grpc, metrics = free_ports(3)
    log = open(tmp_path / "serve.log", "w+")
    env = {**os.environ, "PYTHONPATH": str(Path(launcher.__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-m", "tritongen.cli", "serve", "--http-port", str(http),
                             "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--repo-dir",
                             str(tmp_path / "repo"), "--dtype", "float32", "--device", "cpu", "--num-blocks", "64"],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 300
        while "Triton is ready" not in (tmp_path / "serve.log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(0.5)
        from tritongen.tokenizer import apply_chat_template, load_tokenizer

        prompt = apply_chat_template(load_tokenizer(default_model_dir),
                                     [{"role": "user", "content": "What is the capital of France?"}])
        req = urllib.request.Request(f"http://127.0.0.1:{http}/v2/models/llm/generate", data=json.dumps(
            {"text_input": prompt, "max_tokens": 16, "temperature": 0.0, "exclude_input_in_output": True}).encode())
        assert "Paris" in json.loads(urllib.request.urlopen(req, timeout=120).read())["text_output"]
        script = Path(__file__).resolve().parents[2] / "clients" / "python" / "triton_stream_client.py"
        out = subprocess.run([sys.executable, str(script), "--url", f"127.0.0.1:{grpc}", "--max-tokens", "8",
                              "Hello"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "TTFT" in out.stdout, out.stdout + out.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        log.close()
    assert code == 0
    for port in (http, grpc, metrics):
        assert port_is_free(port)
