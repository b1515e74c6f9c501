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
    assert names == ["ensemble", "fastertransformer", "llm", "llm_bls", "llm_tokens", "postprocessing", "preprocessing",
                     "tensorrt_llm", "tensorrt_llm_bls"]
    config = (tmp_path / "llm" / "config.pbtxt").read_text()
    assert "decoupled: true" in config and 'key: "max_num_seqs" value: { string_value: "8" }' in config
    assert 'key: "enable_prefix_caching" value: { string_value: "false" }' in config
    body = (tmp_path / "llm" / "1" / "model.py").read_text()
    assert "from tritongen.triton.llm_model import TritonPythonModel as _Model" in body and len(body.splitlines()) <= 16
    assert 'faulthandler.enable(all_threads=getattr(_Model, "FAULT_ALL_THREADS", True))' in body
    assert "faulthandler.disable()" in body
    compile(body, "model.py", "exec")
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


def test_repo_writes_max_queue_parameter(tmp_path):
    from tritongen.cli import main

    assert main(["repo", "--model", "dummy:tiny-llama", "--out", str(tmp_path / "a")]) == 0
    assert 'key: "max_queue" value: { string_value: "4096" }' in (tmp_path / "a" / "llm" / "config.pbtxt").read_text()
    assert main(["repo", "--model", "dummy:tiny-llama", "--out", str(tmp_path / "b"), "--max-queue", "0"]) == 0
    assert 'key: "max_queue" value: { string_value: "0" }' in (tmp_path / "b" / "llm" / "config.pbtxt").read_text()
    assert "max_queue" not in (tmp_path / "b" / "llm_bls" / "config.pbtxt").read_text()
    with pytest.raises(ValueError, match="max_queue"):
        write_repository(tmp_path / "c", {"model": "dummy:tiny-llama"}, max_queue=-1)


@pytest.mark.parametrize("model, words", [
    ("dummy:no-such-preset", "unknown dummy preset 'dummy:no-such-preset'"),
    ("/nonexistent/model/dir", "no such directory"),
    ("EMPTY", "has no config.json"),
])
def test_serve_refuses_a_bad_model_before_starting(tmp_path, capsys, model, words):
    from tritongen.cli import main

    if model == "EMPTY":
        model = str(tmp_path)
    began = time.monotonic()
    assert main(["serve", "--model", model, "--repo-dir", str(tmp_path / "repo")]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err
    assert time.monotonic() - began < 5 and not (tmp_path / "repo").exists()  # nothing was started or written


def test_serve_refuses_a_busy_port_in_one_line(tmp_path, capsys):
    import socket

    from tritongen.cli import main
    from triton_helpers import free_ports

    http, grpc = free_ports(2)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--model", "dummy:tiny-llama", "--http-port", str(http), "--grpc-port", str(grpc),
                     "--metrics-port", str(port), "--repo-dir", str(tmp_path / "repo")]) == 2
    err = capsys.readouterr().err
    assert f"port {port} (--metrics-port)" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "repo").exists()
    assert main(["serve", "--model", "dummy:tiny-llama", "--http-port", str(http), "--grpc-port", str(http)]) == 2
    assert "both" in capsys.readouterr().err


def test_thread_pool_follows_max_num_seqs(tmp_path, capsys):
    """Twice the largest max_num_seqs of the repository, within [64, 1024]; the serve flag wins."""
    for seqs, pool in ((256, 512), (8, 64), (4096, 1024)):
        repo = write_repository(tmp_path / f"repo{seqs}", {"model": "dummy:tiny-llama", "max_num_seqs": seqs})
        assert launcher.thread_pool_size_for(repo) == pool
        server = launcher.TritonServer(repo)
        assert f"--backend-config=python,thread-pool-size={pool}" in server.command(launcher.find_tritonserver(), None)
        server.thread_pool_size = 48
        assert "--backend-config=python,thread-pool-size=48" in server.command(launcher.find_tritonserver(), None)
    assert launcher.thread_pool_size_for(tmp_path / "empty") == 512  # the engine's default 256
    from tritongen.cli import main

    assert main(["serve", "--model", "dummy:tiny-llama", "--thread-pool-size", "0",
                 "--repo-dir", str(tmp_path / "never")]) == 2
    assert "--thread-pool-size must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_shared_server_starts_a_pool_of_twice_max_num_seqs(triton):
    """The tests' TINY engine runs 64 sequences: 128 threads per Python model, not 1024."""
    assert "--backend-config=python,thread-pool-size=128" in triton.server.command_line


def test_cpu_start_has_no_gpu_alarms(triton):
    """The shared server ran on CPU with CPU_ARGS: no NVML/DCGM/pinned-memory lines in its log."""
    if launcher.has_gpu():
        pytest.skip("a GPU machine")
    assert all(arg in triton.server.command_line for arg in launcher.CPU_ARGS)
    log = Path(triton.server.log_file).read_text(errors="replace")
    assert "Started HTTPService" in log
    for alarm in ("Failed to initialize NVML", "DCGM unable to start", "Unable to allocate pinned system memory"):
        assert alarm not in log


def _fake_stub(tmp_path, parent_pid: int):
    """A process whose /proc cmdline looks like a stub of tritonserver `parent_pid` (argv[0] ends in
    triton_python_backend_stub, argv[1] repo/<model>/1/model.py, argv[2] its shm region, argv[5] the parent)."""
    model_py = tmp_path / "repo" / "llm" / "1" / "model.py"
    model_py.parent.mkdir(parents=True)
    model_py.write_text("import time\ntime.sleep(120)\n")
    region = f"triton_python_backend_shm_region_tritongen-test-{os.getpid()}-{parent_pid}"
    (launcher.SHM_DIR / region).write_bytes(b"x")
    argv = [str(tmp_path / launcher.STUB_NAME), str(model_py), region, "1048576", "1048576", str(parent_pid)]
    return subprocess.Popen(argv, executable=sys.executable), region


def test_leftover_stubs_are_found_by_parent_pid_and_reaped(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", "pass"])
    parent.wait()  # a tritonserver that is gone: its stub is an orphan
    proc, region = _fake_stub(tmp_path, parent.pid)
    try:
        deadline = time.monotonic() + 10
        while not launcher.find_stubs(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        [stub] = launcher.find_stubs(parent.pid)
        assert (stub.pid, stub.model, stub.shm_region, stub.zombie) == (proc.pid, "llm", region, False)
        assert launcher.find_stubs(parent.pid + 1_000_000) == []
        assert launcher.reap_stubs([stub]) == [proc.pid]
        assert proc.wait(timeout=5) == -signal.SIGKILL
        assert not (launcher.SHM_DIR / region).exists()
    finally:
        proc.kill()
        (launcher.SHM_DIR / region).unlink(missing_ok=True)


def test_reap_leaves_a_reused_pid_alone(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", "pass"])
    parent.wait()
    proc, region = _fake_stub(tmp_path, parent.pid)
    try:
        time.sleep(0.3)
        [stub] = launcher.find_stubs(parent.pid)
        other = launcher.StubProcess(stub.pid, stub.model, "", ("something", "else"), False)
        assert launcher.reap_stubs([other]) == [] and proc.poll() is None
    finally:
        proc.kill()
        (launcher.SHM_DIR / region).unlink(missing_ok=True)
