"""Hostile and unlucky clients against the real tritonserver (issue 21): the malformed-input corpus
on every Triton path, a cancel storm, a forged abort, and bad seeds beside an innocent stream.
The full-size soak is benchmarks/soak.py (docs/reliability.md)."""
import asyncio
import concurrent.futures
import json
import time
import urllib.request

import numpy as np
import pytest

from triton_helpers import generate, grpc_stream, http_post, text
from tritongen.bench import malformed, soak


def urls(triton) -> soak.Urls:
    return soak.Urls(http=triton.http, grpc=triton.grpc, metrics=triton.metrics)


def test_malformed_corpus_every_triton_path_is_a_named_client_error(triton):
    cases = malformed.triton_cases()
    assert len(cases) >= 200
    report = asyncio.run(soak.check_corpus(cases, urls(triton)))
    assert report.failures == [] and report.passed == len(cases)
    assert report.slowest_s < 5.0  # at once, not after a timeout
    assert generate(triton.http, "llm", {"text_input": "fine", "max_tokens": 2})["text_output"]
    assert soak.wait_idle(triton.metrics)["tritongen_kv_cache_usage_ratio"] == 0


def test_cancel_storm_every_path_no_hang_no_leak_no_crossed_answers(triton):
    paths = ("triton-grpc-stream", "triton-grpc-unary", "triton-sse", "triton-generate")
    # A request here takes ~0.25 s: cancels within 0.2 s land (before the first token or mid-stream),
    # so ~30 % of the 240 are cancelled whatever the machine's speed within a few times this one's.
    report = asyncio.run(soak.cancel_storm(urls(triton), paths, num_requests=240, concurrency=24, max_tokens=12,
                                           max_cancel_delay_s=0.2))
    assert report.hangs == 0 and report.errors == [] and report.mismatched == []
    assert report.cancelled >= 20 and report.completed >= 100
    assert set(report.by_path) == set(paths)
    idle = soak.wait_idle(triton.metrics)
    assert idle == {"tritongen_num_requests_running": 0, "tritongen_num_requests_waiting": 0,
                    "tritongen_kv_cache_usage_ratio": 0}


def test_a_forged_abort_cannot_cancel_another_clients_stream(triton):
    long = {"max_tokens": np.array([300], np.int32), "ignore_eos": np.array([True])}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        victim = pool.submit(grpc_stream, triton.grpc, "llm", {"text_input": text("go on"), **long},
                             120, "victim-1")
        time.sleep(0.5)
        for model in ("llm", "llm_bls"):
            for target in ("victim-1", "victim-1-0"):
                status, raw = http_post(triton.http, f"/v2/models/{model}/generate", {"abort_request_id": target})
                assert status == 400 and "abort_request_id" in json.loads(raw)["error"], raw
        results, finals = victim.result(timeout=120)
    assert finals == 1 and sum(r.as_numpy("text_output").size for r in results) >= 1


@pytest.mark.parametrize("model", ["llm", "llm_bls"])
def test_bad_seeds_beside_an_innocent_stream_fail_alone(triton, model):
    long = {"max_tokens": np.array([150], np.int32), "ignore_eos": np.array([True]), "stream": np.array([True])}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        innocent = pool.submit(grpc_stream, triton.grpc, "llm", {"text_input": text("keep going"), **long})
        for seed, needle in (("18446744073709551616", "seed"), ("-9223372036854775809", "seed"),
                             ("1" * 5000, "sampling_parameters")):
            for _ in range(3):  # more than the engine's old limit of consecutive failed steps
                body = {"text_input": "hi", "sampling_parameters": '{"max_tokens": 8, "seed": %s}' % seed}
                status, raw = http_post(triton.http, f"/v2/models/{model}/generate", body)
                assert status == 400 and needle in json.loads(raw)["error"], raw
        results, finals = innocent.result(timeout=120)  # raises if the stream got an error
    assert finals == 1 and len(results) >= 10
    with urllib.request.urlopen(f"http://{triton.http}/v2/models/llm/ready", timeout=10) as resp:
        assert resp.status == 200
    assert generate(triton.http, model, {"text_input": "still here", "max_tokens": 2})["text_output"]
