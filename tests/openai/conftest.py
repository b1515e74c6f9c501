"""A real uvicorn server on a free 127.0.0.1 port, in a background thread, over one shared
tiny-model engine (random weights, SmolLM2's tokenizer and chat template)."""
import socket
import threading
import time

import pytest

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


@pytest.fixture(scope="session")
def engine():
    llm = make_engine()
    yield llm
    llm.shutdown()


@pytest.fixture(scope="session")
def server(engine):
    from tritongen.openai.server import build_app

    srv = ServerThread(build_app(engine, served_model_name=MODEL, max_body_bytes=1 << 20))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


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
