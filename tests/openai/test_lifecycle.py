"""Client disconnects abort at once and free blocks; auth; 503 when the queue is full."""
import json
import socket

import httpx
import openai
import pytest

from oai_helpers import MODEL, ServerThread, make_engine, metric
from proc_helpers import wait_until


def wait_for(cond, timeout=5.0):
    return wait_until(cond, timeout, interval=0.02)


def aborted(url):
    return metric(url, "tritongen_request_success_total", finish_reason="abort")


def _streamed_then_closed(url, path, body):
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", url + path, json=body) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            next(lines)
            assert metric(url, "tritongen_kv_cache_usage_ratio") > 0


def _sent_then_closed(url, path, body):
    """A non-streaming request answers only at the end, so talk HTTP on a raw socket and hang up."""
    data = json.dumps(body).encode()
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        assert wait_for(lambda: metric(url, "tritongen_num_requests_running") == 1)
        assert metric(url, "tritongen_kv_cache_usage_ratio") > 0


@pytest.mark.parametrize("path,body,talk", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "go on"}], "stream": True},
     _streamed_then_closed),
    ("/v1/completions", {"prompt": "go on", "stream": True}, _streamed_then_closed),
    ("/v1/completions", {"prompt": "go on"}, _sent_then_closed),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "go on"}]}, _sent_then_closed),
])
def test_disconnect_aborts_and_frees_blocks(server, engine, path, body, talk):
    before = aborted(server.url)
    talk(server.url, path, {**body, "max_tokens": 1500, "ignore_eos": True})
    # The connection is closed; 1500 tokens would take far longer than these waits.
    assert wait_for(lambda: metric(server.url, "tritongen_num_requests_running") == 0, 3)
    assert metric(server.url, "tritongen_kv_cache_usage_ratio") == 0
    assert engine.stats()["kv_blocks_free"] == engine.stats()["kv_blocks_total"]
    assert wait_for(lambda: aborted(server.url) == before + 1, 3)


def test_api_key(engine):
    from tritongen.openai.server import build_app

    srv = ServerThread(build_app(engine, served_model_name=MODEL, api_key="sekret"))
    try:
        for key in ("wrong", None):
            headers = {} if key is None else {"Authorization": f"Bearer {key}"}
            r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(srv.url + "/v1/models").status_code == 401
        assert httpx.get(srv.url + "/health").status_code == 200  # probes need no key
        good = openai.OpenAI(base_url=srv.url + "/v1", api_key="sekret", max_retries=0)
        assert good.completions.create(model=MODEL, prompt="x", max_tokens=2).usage.completion_tokens >= 1
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0).models.list()
    finally:
        srv.stop()


def test_503_when_the_waiting_queue_is_full():
    from tritongen.openai.server import build_app

    small = make_engine(max_num_seqs=1)
    srv = ServerThread(build_app(small, served_model_name=MODEL, max_queue=1))
    body = {"prompt": "busy", "max_tokens": 1500, "ignore_eos": True, "stream": True}
    try:
        with httpx.Client(timeout=30) as a, httpx.Client(timeout=30) as b:
            with a.stream("POST", srv.url + "/v1/completions", json=body) as ra:
                lines = ra.iter_lines()  # (keep a reference: a collected iterator closes the response)
                next(lines)  # running
                with b.stream("POST", srv.url + "/v1/completions", json=body) as rb:
                    assert rb.status_code == 200  # admitted: nobody was waiting
                    assert wait_for(lambda: metric(srv.url, "tritongen_num_requests_waiting") == 1)
                    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
                    assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
                    with pytest.raises(openai.APIStatusError) as info:
                        openai.OpenAI(base_url=srv.url + "/v1", api_key="-", max_retries=0).chat.completions.create(
                            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=1)
                    assert info.value.status_code == 503
        assert wait_for(lambda: small.stats()["num_running"] + small.stats()["num_waiting"] == 0)
        assert httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 200
    finally:
        srv.stop()
        small.shutdown()
