"""Issue 21 items 8, 9, 11, 12 and the failure contract on the OpenAI front, against the real server:
a client that leaves is a quiet abort, undecodable or hostile bodies are 400s, a full server is a
503 at once, huge prompts are refused before tokenizing and tokenizing never blocks /health, and
a server fault is never a 4xx."""
import asyncio
import json
import logging
import socket
import threading
import time

import httpx
import pytest

from oai_helpers import MODEL, ServerThread, make_engine, metric
from proc_helpers import wait_until

REJECTED = "tritongen_request_rejected_total"


def aborted(url):
    return metric(url, "tritongen_request_success_total", finish_reason="abort")


@pytest.fixture
def error_logs():
    """ERROR records from our code, uvicorn ("Exception in ASGI application") and asyncio."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep(logging.ERROR)
    loggers = [logging.getLogger(n) for n in ("", "uvicorn", "uvicorn.error", "asyncio")]
    for lg in loggers:
        lg.addHandler(handler)
    yield records
    for lg in loggers:
        lg.removeHandler(handler)


def send_then_leave(url, path, body, after_s):
    """POST on a raw socket and hang up after `after_s` seconds, before any answer."""
    data = json.dumps(body).encode()
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        time.sleep(after_s)


# -- item 8: the client leaves a non-streamed request -------------------------------------------

@pytest.mark.parametrize("path,body,num_prompts", [
    ("/v1/completions", {"prompt": ["go on", "and on"]}, 2),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "go on"}]}, 1),
])
def test_client_leaving_after_200ms_is_a_quiet_abort(server, engine, error_logs, path, body, num_prompts):
    before = aborted(server.url)
    send_then_leave(server.url, path, {**body, "max_tokens": 1500, "ignore_eos": True}, 0.2)
    assert wait_until(lambda: aborted(server.url) == before + num_prompts, 5, interval=0.02)
    assert wait_until(lambda: engine.stats()["num_running"] + engine.stats()["num_waiting"] == 0, 3, interval=0.02)
    assert engine.stats()["kv_blocks_free"] == engine.stats()["kv_blocks_total"]
    assert server.server.config.app.state.server.admission.in_flight == 0
    time.sleep(0.2)  # let any late error log land
    assert not error_logs, [r.getMessage() for r in error_logs]


# -- item 9: bodies json.loads takes but nothing after it can -------------------------------------

def post_raw(url, path, raw: bytes):
    return httpx.post(url + path, content=raw, headers={"Content-Type": "application/json"}, timeout=30)


@pytest.mark.parametrize("path,raw,param", [
    ("/v1/completions", b'{"prompt": "\\ud800", "max_tokens": 2}', "prompt"),
    ("/v1/completions", b'{"prompt": ["ok", "a\\udfffb"], "max_tokens": 2}', "prompt"),
    ("/v1/completions", b'{"prompt": "hi", "stop": ["\\ud83d"], "max_tokens": 2}', "stop"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\udc00"}], "max_tokens": 2}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "user": "\\ud800x"}', "user"),
])
def test_lone_surrogates_are_400_naming_the_field(server, path, raw, param):
    r = post_raw(server.url, path, raw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and "surrogate" in err["message"]


def test_a_surrogate_pair_is_a_character_not_an_error(server):
    r = post_raw(server.url, "/v1/completions", b'{"prompt": "smile \\ud83d\\ude00", "max_tokens": 2}')
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("raw", [
    b"[" * 100000 + b"]" * 100000,
    b'{"prompt": "x", "response_format": ' + b'{"a": ' * 100 + b"1" + b"}" * 100 + b"}",
    b'{"prompt": ' + b"[" * 500 + b"1" + b"]" * 500 + b"}",
])
def test_deep_nesting_is_400(server, raw):
    for path in ("/v1/completions", "/v1/chat/completions"):
        r = post_raw(server.url, path, raw)
        assert r.status_code == 400, r.text
        assert "nested too deeply" in r.json()["error"]["message"]
    assert httpx.get(server.url + "/health").status_code == 200


# -- item 11: admission control -------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_server():
    """max_num_seqs 4 + max_queue 8: at most 12 engine requests admitted at once."""
    from tritongen.openai.server import build_app

    small = make_engine(max_num_seqs=4)
    srv = ServerThread(build_app(small, served_model_name=MODEL, max_queue=8))
    yield srv, small
    srv.stop()
    small.shutdown()


async def _burst(url, n):
    """n streamed requests at once; returns their statuses, holding the admitted ones open until
    all have answered (so none finishes and frees its slot during the burst)."""
    body = {"prompt": "busy", "max_tokens": 1500, "ignore_eos": True, "stream": True}
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        all_answered = asyncio.Event()
        statuses, types, took = [], [], []

        async def one():
            t0 = time.monotonic()
            async with http.stream("POST", url + "/v1/completions", json=body) as r:
                statuses.append(r.status_code)
                if r.status_code != 200:
                    types.append(json.loads(await r.aread())["error"]["type"])
                    took.append(time.monotonic() - t0)
                if len(statuses) == n:
                    all_answered.set()
                await all_answered.wait()

        await asyncio.gather(*(one() for _ in range(n)))
    return statuses, types, took


def test_a_burst_gets_503_beyond_max_num_seqs_plus_max_queue(small_server):
    srv, small = small_server
    rejected = metric(srv.url, REJECTED)
    statuses, types, took = asyncio.run(_burst(srv.url, 64))
    assert statuses.count(200) == 12 and statuses.count(503) == 52, sorted(statuses)
    assert set(types) == {"service_unavailable"}
    assert max(took) < 10  # at once, not after the admitted ones finish (1500 tokens each)
    assert metric(srv.url, REJECTED) == rejected + 52
    # The admitted streams were closed: every slot and block comes back.
    app_server = srv.server.config.app.state.server
    assert wait_until(lambda: app_server.admission.in_flight == 0, 5, interval=0.02)
    assert wait_until(lambda: small.stats()["kv_blocks_free"] == small.stats()["kv_blocks_total"], 5, interval=0.02)
    assert httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 200


def test_each_prompt_of_a_request_counts(small_server):
    srv, _ = small_server
    rejected = metric(srv.url, REJECTED)
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": ["p"] * 13, "max_tokens": 1}, timeout=30)
    assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable", r.text
    assert metric(srv.url, REJECTED) == rejected + 1
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": ["p"] * 12, "max_tokens": 1}, timeout=30)
    assert r.status_code == 200 and len(r.json()["choices"]) == 12


def test_max_queue_0_means_no_bound(engine):
    from tritongen.openai.server import build_app

    srv = ServerThread(build_app(engine, served_model_name=MODEL, max_queue=0, max_num_seqs=1))
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": ["p"] * 20, "max_tokens": 1}, timeout=30)
        assert r.status_code == 200 and len(r.json()["choices"]) == 20
        assert srv.server.config.app.state.server.admission.in_flight == 0
    finally:
        srv.stop()


# -- item 12: huge prompts ------------------------------------------------------------------------

def test_a_prompt_too_long_to_fit_is_refused_before_tokenizing(server, engine):
    app_server = server.server.config.app.state.server
    limit = app_server.max_prompt_chars
    assert limit >= engine.max_model_len  # never refuses what could fit: a token is >= 1 character
    for path, body in [("/v1/completions", {"prompt": "word " * (limit // 5 + 1)}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w" * (limit + 1)}]})]:
        r = httpx.post(server.url + path, json={**body, "max_tokens": 1}, timeout=30)
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "context_length_exceeded", r.text
        assert "characters" in err["message"] and err["param"] in ("prompt", "messages")


def test_tokenizing_does_not_block_health(server):
    """Prompts of digits just under the character bound take a while each to tokenize (a token per
    digit; then they are refused as too many tokens). /health answers meanwhile: its slowest
    answer is far quicker than one such request, which it could not be if tokenizing held the loop."""
    import random

    limit = server.server.config.app.state.server.max_prompt_chars
    prompt = "".join(random.Random(0).choices("0123456789", k=limit - 1))
    done = threading.Event()
    latencies, statuses = [], []

    def big():
        with httpx.Client(timeout=60) as http:
            for _ in range(4):
                t0 = time.monotonic()
                r = http.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1})
                latencies.append(time.monotonic() - t0)
                statuses.append((r.status_code, r.json()["error"]["code"]))
        done.set()

    threading.Thread(target=big, daemon=True).start()
    gaps = []
    with httpx.Client(timeout=10) as http:
        while not done.is_set():
            t0 = time.monotonic()
            assert http.get(server.url + "/health").status_code == 200
            gaps.append(time.monotonic() - t0)
            time.sleep(0.01)
    assert statuses == [(400, "context_length_exceeded")] * 4
    assert len(gaps) >= 8 and max(gaps) < 0.5 * min(latencies), (gaps, latencies)


# -- failure contract: a server fault is never a 4xx ---------------------------------------------

def test_one_request_failing_in_the_engine_is_500_and_the_next_is_served():
    from tritongen.openai.server import build_app

    small = make_engine()
    runner, failed = small.engine.runner, []

    def failing_once(real):
        def run(sched):
            if not failed and not sched.is_empty:
                failed.append(sched)
                raise RuntimeError("injected fault")
            return real(sched)
        return run

    for name in ("execute", "launch"):  # fault injection into the real runner, whichever it steps with
        if hasattr(runner, name):
            setattr(runner, name, failing_once(getattr(runner, name)))
    srv = ServerThread(build_app(small, served_model_name=MODEL))
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
        assert r.status_code == 500, r.text
        err = r.json()["error"]
        assert err["type"] == "server_error" and "injected fault" in err["message"]
        assert metric(srv.url, "tritongen_request_success_total", finish_reason="error") == 1
        assert httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
    finally:
        srv.stop()
        small.shutdown()


def test_a_dead_engine_is_503_service_unavailable():
    from tritongen.openai.server import build_app

    small = make_engine()
    srv = ServerThread(build_app(small, served_model_name=MODEL))
    try:
        small.shutdown()
        for path, body in [("/v1/completions", {"prompt": "x", "max_tokens": 2}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})]:
            r = httpx.post(srv.url + path, json=body, timeout=30)
            assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable", r.text
        assert httpx.get(srv.url + "/health").status_code == 503
    finally:
        srv.stop()
