"""Helpers of the OpenAI server tests: a real uvicorn server on a free 127.0.0.1 port in a
background thread, the tiny-model engine, and /metrics reading. (A uniquely named module: several
test directories have a conftest.py, so tests import helpers from here, not from conftest.)"""
import socket
import threading
import time

MODEL = "dummy:tiny-llama"


class ServerThread:
    """uvicorn serving `app` on a socket bound here (no port race); stop() ends it."""

    def __init__(self, app) -> None:
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def make_engine(**kwargs):
    from tritongen import AsyncLLM

    opts = dict(dtype="float32", device="cpu", kv_cache_memory_gb=0.05)
    opts.update(kwargs)
    return AsyncLLM(MODEL, **opts)


def metric(url: str, name: str, **labels) -> float:
    """Sum of the samples called `name` on /metrics whose labels include `labels` (0 if none)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


DASHBOARD = __import__("pathlib").Path(__file__).resolve().parents[2] / "deploy/grafana/tritongen.json"


def dashboard_metric_names() -> set[str]:
    """Series names that the Grafana dashboard's queries read (tritongen_* and nv_inference_*)."""
    import json
    import re

    names = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            names |= set(re.findall(r"\b((?:tritongen|nv_inference)_\w+)", target["expr"]))
    return names


def exported_series(metrics_text: str) -> set[str]:
    """Names of the samples in a Prometheus text exposition."""
    import re

    return {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][\w:]*)[{ ]", metrics_text, re.M)}
