"""The OpenAI server's perf-metrics opt-in: `return_perf_metrics: true` adds usage.perf_metrics
(engine wall-clock times and the durations derived from them), consistent with the client's clock."""
import json
import time

import httpx

from oai_helpers import MODEL

BODY = {"model": MODEL, "max_tokens": 5, "temperature": 0, "ignore_eos": True}


def check(perf: dict, before: float, after: float, tokens: int) -> None:
    times = [perf[k] for k in ("arrival_time", "first_scheduled_time", "first_token_time", "last_token_time")]
    assert before <= times[0] <= times[1] <= times[2] < times[3] <= after, (before, times, after)
    assert abs(perf["queue_time"] - (times[1] - times[0])) < 1e-9
    assert abs(perf["time_to_first_token"] - (times[2] - times[0])) < 1e-9
    assert abs(perf["time_per_output_token"] - (times[3] - times[2]) / (tokens - 1)) < 1e-9


def test_off_unless_asked(server):
    r = httpx.post(server.url + "/v1/completions", json={**BODY, "prompt": "hi"}, timeout=60).json()
    assert "perf_metrics" not in r["usage"]


def test_completions_and_chat(server):
    before = time.time()
    r = httpx.post(server.url + "/v1/completions", json={**BODY, "prompt": "hi", "return_perf_metrics": True},
                   timeout=60).json()
    check(r["usage"]["perf_metrics"], before, time.time(), 5)
    before = time.time()
    r = httpx.post(server.url + "/v1/chat/completions", json={
        **BODY, "messages": [{"role": "user", "content": "hi"}], "return_perf_metrics": True}, timeout=60).json()
    check(r["usage"]["perf_metrics"], before, time.time(), 5)
    r = httpx.post(server.url + "/v1/completions", json={**BODY, "prompt": ["a", "b"], "return_perf_metrics": True},
                   timeout=60).json()
    assert len(r["usage"]["perf_metrics"]) == 2


def test_streaming_usage_chunk(server):
    before = time.time()
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60, json={
            **BODY, "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": True}, "return_perf_metrics": True}) as resp:
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    check(events[-1]["usage"]["perf_metrics"], before, time.time(), 5)


def test_strict_type(server):
    r = httpx.post(server.url + "/v1/completions", json={**BODY, "prompt": "hi", "return_perf_metrics": "yes"},
                   timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "return_perf_metrics"
