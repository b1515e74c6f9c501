"""Small clients for the tests: gRPC stream, HTTP generate / generate_stream, metrics scraping; free ports."""
from __future__ import annotations

import json
import os
import queue
import re
import socket
import urllib.error
import urllib.request
from typing import Optional

import numpy as np

from tritongen.netutil import free_ports  # noqa: F401  (the tests import it from here)

# Engine options of the served tiny model; the in-process reference uses the same ones.
TINY = {"model": "dummy:tiny-llama", "dtype": "float32", "device": "cpu", "num_blocks": 256, "seed": 0,
        "max_num_seqs": 64}


def text(value: str, batch: bool = False) -> np.ndarray:
    arr = np.array([value.encode("utf-8")], dtype=np.object_)
    return arr.reshape(1, 1) if batch else arr


def grpc_inputs(inputs: dict):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    out = []
    for name, arr in inputs.items():
        arr = np.asarray(arr)
        t = grpcclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


def grpc_stream(url: str, model: str, inputs: dict, timeout: float = 120, request_id: str = ""):
    """Send one request on a gRPC stream; return (data responses, number of FINAL flags seen).
    Raises the InferenceServerException of an error response."""
    import tritonclient.grpc as grpcclient

    q: "queue.Queue" = queue.Queue()

    def callback(result, error):  # tritonclient requires exactly these parameter names
        q.put((result, error))

    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=callback)
    try:
        client.async_stream_infer(model, grpc_inputs(inputs), request_id=request_id,
                                  enable_empty_final_response=True)
        results, finals = [], 0
        while True:
            result, error = q.get(timeout=timeout)
            if error is not None:
                raise error
            final = result.get_response().parameters["triton_final_response"].bool_param
            if result.get_response().outputs:
                results.append(result)
            if final:
                finals += 1
                break
        try:  # nothing may follow the FINAL response
            extra = q.get(timeout=0.2)
            raise AssertionError(f"response after FINAL: {extra}")
        except queue.Empty:
            pass
        return results, finals
    finally:
        client.stop_stream()
        client.close()


def texts(results, name: str = "text_output") -> list[str]:
    return [b"".join(r.as_numpy(name).reshape(-1)).decode("utf-8") for r in results]


def http_post(url: str, path: str, body: dict, timeout: float = 120) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://{url}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def generate(url: str, model: str, body: dict) -> dict:
    status, raw = http_post(url, f"/v2/models/{model}/generate", body)
    assert status == 200, raw
    return json.loads(raw)


def generate_stream(url: str, model: str, body: dict) -> list[dict]:
    status, raw = http_post(url, f"/v2/models/{model}/generate_stream", body)
    assert status == 200, raw
    events = [json.loads(line[len("data: "):]) for line in raw.decode("utf-8").splitlines()
              if line.startswith("data: ")]
    for event in events:
        assert "error" not in event, event
    return events


def metric(url: str, name: str, model: str = "llm") -> Optional[float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = resp.read().decode()
    m = re.search(rf'^{name}\{{[^}}]*model="{model}"[^}}]*\}} (\S+)$', body, re.M)
    return float(m.group(1)) if m else None


def stub_pids(repo) -> list[int]:
    """Python-backend stub processes serving models of `repo`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"triton_python_backend_stub") and any(str(repo).encode() in c for c in cmd):
            pids.append(int(entry))
    return pids


def port_is_free(port: int) -> bool:
    """Nothing listens on `port` (SO_REUSEADDR: a TIME_WAIT left by a stopped server does not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def stop_and_check(server, repo, ports) -> None:
    """Stop a test's tritonserver by its PID and check it left nothing behind: no process, no
    Python-backend stub of `repo`, none of `ports` still bound."""
    pid = server.process.pid
    server.stop()
    assert server.process.poll() is not None, f"tritonserver {pid} still running"
    assert not stub_pids(repo), "Python-backend stubs outlived the server"
    for port in ports:
        assert port_is_free(port), f"port {port} still bound after tritonserver {pid} stopped"
