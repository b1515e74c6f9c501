"""clients/: what the example clients print and send, checked without a model server (fakes only).

The clients are also run against real servers in tests/triton and tests/openai; these tests cover
what those cannot force: a generation with no text, a missing optional package, the Java client's
request headers.
"""
import importlib.util
import json
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

CLIENTS = Path(__file__).resolve().parents[2] / "clients"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, CLIENTS / "python" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _FakeResult:
    def __init__(self, text, final):
        self.text, self.final = text, final

    def get_response(self):
        class Bool:
            bool_param = self.final

        class Response:
            outputs = [] if self.text is None else ["text_output"]
            parameters = {"triton_final_response": Bool()}

        return Response()

    def as_numpy(self, name):
        import numpy as np

        return np.array([self.text.encode()], dtype=np.object_)


def _fake_grpc_client(texts):
    """An InferenceServerClient whose stream answers `texts` (None: the empty FINAL response)."""

    class Client:
        def __init__(self, url):
            pass

        def start_stream(self, callback):
            self.callback = callback

        def async_stream_infer(self, model, inputs, enable_empty_final_response):
            for i, text in enumerate(texts):
                self.callback(result=_FakeResult(text, i == len(texts) - 1), error=None)

        def stop_stream(self):
            pass

        def close(self):
            pass

    return Client


@pytest.mark.parametrize("texts, has_ttft", [([" Paris", ".", None], True), (["", None], False), ([None], False)])
def test_stream_client_prints_ttft_only_after_a_token(monkeypatch, capsys, texts, has_ttft):
    pytest.importorskip("tritonclient.grpc")
    client = _load("triton_stream_client")
    monkeypatch.setattr(client.grpcclient, "InferenceServerClient", _fake_grpc_client(texts))
    assert client.main(["--url", "fake:1", "The capital of France is"]) == 0
    out, err = capsys.readouterr()
    assert ("TTFT: " in out) is has_ttft, out
    if has_ttft:
        assert out.startswith(" Paris.\nTTFT: ") and "2 text responses" in out
    else:
        assert "no text generated" in out and "The capital of France is" in err


def test_clients_default_to_a_prompt_the_raw_text_path_continues():
    for name in ("triton_stream_client", "triton_http_client", "triton_async_client", "openai_client"):
        source = (CLIENTS / "python" / f"{name}.py").read_text()
        assert 'default="The capital of France is"' in source, name


@pytest.mark.parametrize("script, package", [("openai_client.py", "openai"),
                                             ("triton_stream_client.py", "tritonclient"),
                                             ("triton_http_client.py", "tritonclient"),
                                             ("triton_async_client.py", "tritonclient")])
def test_missing_package_is_a_one_line_hint(script, package):
    # None in sys.modules makes `import package` fail as if it were not installed.
    code = (f"import sys, runpy; sys.modules[{package!r}] = None; sys.argv = [{script!r}, '--help']; "
            f"runpy.run_path({str(CLIENTS / 'python' / script)!r}, run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "pip install" in out.stderr, out.stderr
    assert ".[clients]" in out.stderr


class _Recorder(BaseHTTPRequestHandler):
    seen: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.request_version, dict(self.headers), self.path, body))
        reply = json.dumps({"text_output": " Paris."}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def test_java_client_speaks_plain_http_1_1(tmp_path):
    """The JDK's default HTTP/2 mode adds `Upgrade: h2c`, which uvicorn logs a warning for on every
    request ("Unsupported upgrade request")."""
    if not (shutil.which("javac") and shutil.which("java")):
        pytest.skip("javac/java not found: install a JDK 17+ to test clients/java")
    subprocess.run(["javac", "-Xlint:all", "-Werror", "-d", str(tmp_path), str(CLIENTS / "java/TritongenClient.java")],
                   check=True, timeout=120)
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = subprocess.run(["java", "-cp", str(tmp_path), "TritongenClient", "triton-generate", "--url",
                              f"http://127.0.0.1:{server.server_port}"], capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
        server.server_close()
    assert out.returncode == 0 and out.stdout == " Paris.\n", out.stdout + out.stderr
    [(version, headers, path, body)] = _Recorder.seen
    names = {k.lower() for k in headers}
    assert version == "HTTP/1.1" and "upgrade" not in names and "http2-settings" not in names, headers
    assert path == "/v2/models/llm_bls/generate" and body["text_input"] == "The capital of France is"
