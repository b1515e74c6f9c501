"""clients/: the Python SDK example and the single-file Java client, run against real servers."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import urllib.request

from oai_helpers import MODEL, dashboard_metric_names, exported_series
from tritongen.netutil import free_ports

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "What is the capital of France?"


def greedy_chat(client, max_tokens):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                                       max_tokens=max_tokens, temperature=0)
    return r.choices[0].message.content


def test_python_client(server, client):
    out = subprocess.run([sys.executable, str(ROOT / "clients/python/openai_client.py"), "--base-url",
                          server.url + "/v1", "--prompt", PROMPT, "--max-tokens", "8"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "completion: " in out.stdout and "usage: prompt_tokens=" in out.stdout
    assert "chat stream: " + greedy_chat(client, 8) in out.stdout


@pytest.fixture(scope="module")
def java_client(tmp_path_factory):
    if not (shutil.which("javac") and shutil.which("java")):
        pytest.skip("javac/java not found: install a JDK 17+ to test clients/java")
    out = tmp_path_factory.mktemp("java")
    subprocess.run(["javac", "-Xlint:all", "-Werror", "-d", str(out), str(ROOT / "clients/java/TritongenClient.java")],
                   check=True, timeout=120)
    return lambda *args: subprocess.run(["java", "-cp", str(out), "TritongenClient", *args],
                                        capture_output=True, text=True, timeout=300)


def test_java_openai_chat(server, client, java_client):
    want = greedy_chat(client, 8)
    for extra in ([], ["--stream"]):
        out = java_client("openai-chat", "--url", server.url, "--prompt", PROMPT, "--max-tokens", "8", *extra)
        assert out.returncode == 0, out.stderr
        assert out.stdout == want + "\n"
    bad = java_client("openai-chat", "--url", server.url, "--model", "nope", "--prompt", "x")
    assert bad.returncode == 1 and "404" in bad.stderr


def test_java_triton_generate_and_stream(java_client, tmp_path):
    try:
        from tritongen.triton.launcher import TritonServer, find_tritonserver
        from tritongen.triton.repo import write_repository

        find_tritonserver()
    except (ImportError, FileNotFoundError) as exc:
        pytest.skip(f"no tritonserver to test the Triton half of the Java client: {exc}")
    write_repository(tmp_path / "repo", {"model": MODEL, "device": "cpu", "dtype": "float32",
                                         "kv_cache_memory_gb": 0.05})
    http, grpc, metrics = free_ports(3)
    server = TritonServer(tmp_path / "repo", http_port=http, grpc_port=grpc,
                          metrics_port=metrics, log_file=tmp_path / "triton.log", exit_timeout_s=2)
    with server:
        url = f"http://{server.http_url}"
        whole = java_client("triton-generate", "--url", url, "--prompt", PROMPT, "--max-tokens", "8")
        assert whole.returncode == 0, whole.stderr + server._log_tail()
        streamed = java_client("triton-stream", "--url", url, "--prompt", PROMPT, "--max-tokens", "8")
        assert streamed.returncode == 0, streamed.stderr + server._log_tail()
        assert whole.stdout.strip() and streamed.stdout == whole.stdout
        # The Grafana dashboard's series, read from this server's metrics port.
        exported = exported_series(urllib.request.urlopen(server.metrics_url, timeout=10).read().decode())
        wanted = dashboard_metric_names()
        assert wanted <= exported, sorted(wanted - exported)
