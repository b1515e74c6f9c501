"""The Triton backend end to end: a real tritonserver, the tiny model on CPU, gRPC and HTTP, both
tensor layouts (vllm_backend and TensorRT-LLM), llm_bls, the ensemble, cancellation, metrics."""
import concurrent.futures
import json
import threading
import time

import numpy as np
import pytest

from triton_helpers import generate, generate_stream, grpc_stream, http_post, metric, text, texts
from tritongen import SamplingParams

PROMPT = "The quick brown fox"


def greedy(reference_llm, prompt, n):
    return reference_llm.generate([prompt], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))[0]


def vllm_inputs(prompt, stream, **params):
    return {"text_input": text(prompt), "stream": np.array([stream]),
            "sampling_parameters": text(json.dumps(params))}


# -- decoupled llm, both layouts, both protocols ----------------------------------------------


def test_http_generate_vllm_layout_echoes_prompt_and_matches_llm(triton, reference_llm):
    ref = greedy(reference_llm, PROMPT, 12)
    body = {"text_input": PROMPT, "sampling_parameters": json.dumps(
        {"max_tokens": "12", "temperature": "0", "ignore_eos": "true"})}
    assert generate(triton.http, "llm", body)["text_output"] == PROMPT + ref.text
    body["exclude_input_in_output"] = True
    assert generate(triton.http, "llm", body)["text_output"] == ref.text


def test_http_generate_trtllm_layout(triton, reference_llm):
    ref = greedy(reference_llm, PROMPT, 10)
    out = generate(triton.http, "llm", {"text_input": PROMPT, "max_tokens": 10, "temperature": 0.0, "ignore_eos": True,
                                        "bad_words": "", "stop_words": "", "return_finish_reason": True,
                                        "return_num_input_tokens": True, "return_num_output_tokens": True})
    assert out["text_output"] == ref.text  # TensorRT-LLM clients never get the prompt back
    assert out["finish_reason"] == "length" and out["num_output_tokens"] == 10
    assert out["num_input_tokens"] == len(ref.prompt_token_ids)


def test_http_generate_stream_adds_up(triton, reference_llm):
    ref = greedy(reference_llm, PROMPT, 12)
    events = generate_stream(triton.http, "llm", {"text_input": PROMPT, "stream": True, "parameters": {
        "max_tokens": 12, "temperature": 0, "ignore_eos": True}})
    assert len(events) > 1 and "".join(e["text_output"] for e in events) == ref.text


@pytest.mark.parametrize("layout", ["vllm", "trtllm"])
def test_grpc_streaming_deltas_and_one_final(triton, reference_llm, layout):
    ref = greedy(reference_llm, PROMPT, 16)
    if layout == "vllm":
        inputs = vllm_inputs(PROMPT, True, max_tokens=16, temperature=0, ignore_eos=True)
    else:
        inputs = {"text_input": text(PROMPT), "stream": np.array([True]), "max_tokens": np.array([16], np.int32),
                  "temperature": np.array([0.0], np.float32), "ignore_eos": np.array([True]),
                  "stop_words": np.array([b""], dtype=object)}
    results, finals = grpc_stream(triton.grpc, "llm", inputs)
    assert finals == 1 and len(results) > 1
    assert "".join(texts(results)) == ref.text


@pytest.mark.parametrize("layout", ["vllm", "trtllm"])
def test_grpc_non_streaming_is_one_response(triton, reference_llm, layout):
    ref = greedy(reference_llm, PROMPT, 8)
    if layout == "vllm":
        inputs = vllm_inputs(PROMPT, False, max_tokens=8, temperature=0, ignore_eos=True)
        inputs["exclude_input_in_output"] = np.array([True])
    else:
        inputs = {"text_input": text(PROMPT), "request_output_len": np.array([8], np.int32),
                  "temperature": np.array([0.0], np.float32), "ignore_eos": np.array([True])}
    results, finals = grpc_stream(triton.grpc, "llm", inputs)
    assert finals == 1 and texts(results) == [ref.text]


def test_token_ids_in_token_ids_out(triton, reference_llm):
    ids = reference_llm.tokenizer.encode(PROMPT)
    ref = greedy(reference_llm, ids, 8)
    results, _ = grpc_stream(triton.grpc, "llm", {
        "input_ids": np.array(ids + [0, 0], np.int32), "input_lengths": np.array([len(ids)], np.int32),
        "request_output_len": np.array([8], np.int32), "temperature": np.array([0.0], np.float32),
        "ignore_eos": np.array([True])})
    (result,) = results
    assert result.as_numpy("output_ids").tolist() == ref.token_ids
    assert result.as_numpy("sequence_length").tolist() == [8]


def test_unicode_prompt_streams_without_replacement_chars(triton, reference_llm):
    prompt = "你好，世界！😀🎉 café"
    ref = greedy(reference_llm, prompt, 24)
    results, _ = grpc_stream(triton.grpc, "llm", vllm_inputs(prompt, True, max_tokens=24, temperature=0,
                                                             ignore_eos=True))
    deltas = texts(results)
    assert "".join(deltas) == ref.text
    if "\ufffd" not in ref.text:
        assert all("\ufffd" not in d for d in deltas)
    echoed = generate(triton.http, "llm", {"text_input": prompt, "sampling_parameters": json.dumps(
        {"max_tokens": 4, "temperature": 0})})["text_output"]
    assert echoed.startswith(prompt)


def test_stop_string_and_seeded_sampling(triton):
    inputs = vllm_inputs(PROMPT, False, max_tokens=12, temperature=1.0, seed=42, ignore_eos=True)
    a = texts(grpc_stream(triton.grpc, "llm", inputs)[0])
    b = texts(grpc_stream(triton.grpc, "llm", inputs)[0])
    assert a == b  # same seed, same text
    full = a[0][len(PROMPT):]
    stop = full.split()[1] if len(full.split()) > 2 else None
    if stop:
        inputs = vllm_inputs(PROMPT, False, max_tokens=12, temperature=1.0, seed=42, ignore_eos=True, stop=[stop])
        cut = texts(grpc_stream(triton.grpc, "llm", inputs)[0])[0]
        assert cut == PROMPT + full[:full.index(stop)]


# -- llm_bls: the non-decoupled front ---------------------------------------------------------


def test_bls_http_infer_grpc_infer_and_generate(triton, reference_llm):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from triton_helpers import grpc_inputs

    ref = greedy(reference_llm, PROMPT, 10)
    params = json.dumps({"max_tokens": 10, "temperature": 0, "ignore_eos": True})
    client = httpclient.InferenceServerClient(triton.http)
    inputs = []
    for name, arr in (("text_input", text(PROMPT)), ("sampling_parameters", text(params)),
                      ("exclude_input_in_output", np.array([True]))):
        t = httpclient.InferInput(name, list(arr.shape), "BYTES" if arr.dtype == object else "BOOL")
        t.set_data_from_numpy(arr)
        inputs.append(t)
    result = client.infer("llm_bls", inputs)
    assert result.as_numpy("text_output")[0].decode() == ref.text

    g = grpcclient.InferenceServerClient(triton.grpc)
    result = g.infer("llm_bls", grpc_inputs({"text_input": text(PROMPT), "sampling_parameters": text(params),
                                             "stream": np.array([True])}))  # stream is ignored: one answer
    assert result.as_numpy("text_output")[0].decode() == PROMPT + ref.text

    out = generate(triton.http, "llm_bls", {"text_input": PROMPT, "max_tokens": 10, "temperature": 0,
                                            "ignore_eos": True, "return_finish_reason": True})
    assert out["text_output"] == PROMPT + ref.text and out["finish_reason"] == "length"


def test_concurrent_requests_match_sequential(triton, reference_llm):
    prompts = [f"Request number {i} says" for i in range(16)]
    refs = reference_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))

    def one(i):
        model = "llm_bls" if i % 2 else "llm"
        return generate(triton.http, model, {"text_input": prompts[i], "max_tokens": 8, "temperature": 0,
                                             "ignore_eos": True, "exclude_input_in_output": True})["text_output"]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        assert list(pool.map(one, range(16))) == [r.text for r in refs]



def test_many_concurrent_grpc_streams_add_up(triton, reference_llm):
    """Responses are sent from a thread pool while a watcher polls for cancellation: 32 streams at
    once each get deltas (merged when a send was slow) that add up to the reference text, and
    exactly one FINAL each."""
    prompts = [f"Stream {i} of many" for i in range(32)]
    refs = reference_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))

    def one(i):
        results, finals = grpc_stream(triton.grpc, "llm", vllm_inputs(prompts[i], True, max_tokens=32, temperature=0,
                                                                     ignore_eos=True))
        return "".join(texts(results)), finals

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        got = list(pool.map(one, range(32)))
    assert got == [(r.text, 1) for r in refs]

def test_bls_serves_requests_concurrently(triton):
    """One llm_bls instance: N slow requests at once take about as long as one, not N times."""
    body = {"text_input": "x", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    start = time.monotonic()
    generate(triton.http, "llm_bls", body)
    single = time.monotonic() - start
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: generate(triton.http, "llm_bls", body), range(8)))
    assert time.monotonic() - start < 4 * single + 1.0



def test_bls_puts_more_than_32_requests_in_the_engine_at_once(triton):
    """python_backend runs each BLS request on a thread of a pool of 32 by default; the launcher
    raises it, so 48 concurrent llm_bls requests are all in the engine together."""
    body = {"text_input": "y", "max_tokens": 96, "temperature": 0, "ignore_eos": True}
    peak, stop = [0.0], threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], metric(triton.metrics, "tritongen_num_requests_running") or 0.0)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(48) as pool:
            list(pool.map(lambda _: generate(triton.http, "llm_bls", body), range(48)))
    finally:
        stop.set()
        watcher.join()
    assert peak[0] > 32

# -- cancellation -----------------------------------------------------------------------------


def _wait_idle(triton, timeout=3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        usage = metric(triton.metrics, "tritongen_kv_cache_usage_ratio")
        running = metric(triton.metrics, "tritongen_num_requests_running")
        if usage == 0 and running == 0:
            return time.monotonic()
        time.sleep(0.05)
    raise AssertionError(f"blocks not freed: usage={usage} running={running}")


def _wait_busy(triton, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (metric(triton.metrics, "tritongen_kv_cache_usage_ratio") or 0) > 0:
            return
        time.sleep(0.05)
    raise AssertionError("the long request never showed up in the KV gauge")


LONG = {"max_tokens": np.array([1900], np.int32), "ignore_eos": np.array([True])}


def test_grpc_stream_cancel_frees_blocks(triton):
    import queue

    import tritonclient.grpc as grpcclient

    from triton_helpers import grpc_inputs

    q = queue.Queue()
    client = grpcclient.InferenceServerClient(triton.grpc)
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    client.async_stream_infer("llm", grpc_inputs({"text_input": text("go on"), "stream": np.array([True]), **LONG}))
    for _ in range(3):
        assert q.get(timeout=30)[1] is None
    _wait_busy(triton)
    client.stop_stream(cancel_requests=True)
    start = time.monotonic()
    assert _wait_idle(triton) - start < 2.0
    client.close()


def test_bls_cancel_cancels_inner_request(triton):
    import tritonclient.grpc as grpcclient

    from triton_helpers import grpc_inputs

    errors = []
    client = grpcclient.InferenceServerClient(triton.grpc)
    ctx = client.async_infer("llm_bls", grpc_inputs({"text_input": text("go on"), **LONG}),
                             callback=lambda result, error: errors.append(error))
    _wait_busy(triton)
    ctx.cancel()
    _wait_idle(triton)
    assert generate(triton.http, "llm_bls", {"text_input": "ok", "max_tokens": 2})["text_output"]


def test_http_stream_disconnect_aborts(triton):
    import socket

    host, port = triton.http.split(":")
    body = json.dumps({"text_input": "go on", "max_tokens": 1900, "ignore_eos": True, "stream": True}).encode()
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /v2/models/llm/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert s.recv(100).startswith(b"HTTP/1.1 200")
        _wait_busy(triton)
    _wait_idle(triton)


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("body,needle", [
    ({"max_tokens": 4}, "'text_input' or 'input_ids'"),
    ({"text_input": "x", "sampling_parameters": "{not json"}, "'sampling_parameters' is not valid JSON"),
    ({"text_input": "x", "sampling_parameters": '{"max_tokens": "lots"}'}, "sampling_parameters.max_tokens"),
    ({"text_input": "x", "temperature": -1.0}, "temperature"),
    ({"text_input": "x", "top_p": 5.0}, "top_p"),
    ({"text_input": "x", "max_tokens": 0}, "max_tokens"),
    ({"text_input": "hello " * 3000}, "max_model_len"),
    ({"text_input": "x", "beam_width": 2}, "beam_width"),
])
@pytest.mark.parametrize("model", ["llm", "llm_bls"])
def test_bad_input_is_400_with_message_and_server_keeps_serving(triton, model, body, needle):
    status, raw = http_post(triton.http, f"/v2/models/{model}/generate", body)
    assert status == 400 and needle in json.loads(raw)["error"], raw
    assert generate(triton.http, model, {"text_input": "fine", "max_tokens": 2})["text_output"]


def test_grpc_bad_input_is_invalid_argument(triton):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from triton_helpers import grpc_inputs

    bad = {"text_input": text("x"), "sampling_parameters": text('{"n": 3}')}
    with pytest.raises(InferenceServerException) as info:
        grpc_stream(triton.grpc, "llm", bad)  # in-band stream errors carry the message, not a status
    assert "'sampling_parameters.n' must be 1" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        grpcclient.InferenceServerClient(triton.grpc).infer("llm_bls", grpc_inputs(bad))
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "sampling_parameters.n" in info.value.message()
    assert grpc_stream(triton.grpc, "llm", {"text_input": text("fine"), "max_tokens": np.array([2], np.int32)})[1] == 1


# -- metrics ----------------------------------------------------------------------------------


def test_metrics_beside_triton_metrics(triton):
    import urllib.request

    generate(triton.http, "llm", {"text_input": "count me", "max_tokens": 3})
    body = urllib.request.urlopen(triton.metrics).read().decode()
    assert "nv_inference_request_success" in body
    from tritongen.metrics import COUNTERS, GAUGES, HISTOGRAMS

    for name in list(GAUGES) + list(COUNTERS):
        assert f'{name}{{' in body, name
    for name in HISTOGRAMS:
        assert f'{name}_bucket{{' in body, name
    assert metric(triton.metrics, "tritongen_generation_tokens_total") >= 3
    assert 'finish_reason="length"' in body


# -- ensemble layout --------------------------------------------------------------------------


def test_ensemble_trtllm_client(triton, reference_llm):
    """The ensemble is not decoupled: unary infer and /generate; streaming goes to tensorrt_llm_bls."""
    import tritonclient.grpc as grpcclient

    from triton_helpers import grpc_inputs

    ref = greedy(reference_llm, PROMPT, 10)
    out = generate(triton.http, "ensemble", {"text_input": PROMPT, "max_tokens": 10, "bad_words": "",
                                             "stop_words": "", "temperature": 0.0})
    assert out["text_output"] == ref.text
    inputs = {"text_input": text(PROMPT, batch=True), "max_tokens": np.array([[10]], np.int32),
              "temperature": np.array([[0.0]], np.float32)}
    result = grpcclient.InferenceServerClient(triton.grpc).infer("ensemble", grpc_inputs(inputs))
    assert result.as_numpy("text_output").tolist() == [[ref.text.encode()]]
    results, finals = grpc_stream(triton.grpc, "tensorrt_llm_bls", {**inputs, "stream": np.array([[True]])})
    assert finals == 1 and len(results) > 1 and "".join(texts(results)) == ref.text


def test_ensemble_and_trtllm_bls_unicode(triton, reference_llm):
    prompt = "日本語のテキスト 🍣🍜"
    ref = greedy(reference_llm, prompt, 20)
    body = {"text_input": prompt, "max_tokens": 20, "temperature": 0.0}
    assert generate(triton.http, "ensemble", body)["text_output"] == ref.text
    events = generate_stream(triton.http, "tensorrt_llm_bls", {**body, "stream": True})
    assert "".join(e["text_output"] for e in events) == ref.text


def test_token_model_streams_and_answers_once(triton, reference_llm):
    """llm_tokens (tensorrt_llm's tensors, decoupled): `streaming` chooses; output_ids [1, 1, L]."""
    ids = reference_llm.tokenizer.encode(PROMPT)
    ref = greedy(reference_llm, ids, 6)
    inputs = {"input_ids": np.array([ids], np.int32), "input_lengths": np.array([[len(ids)]], np.int32),
              "request_output_len": np.array([[6]], np.int32), "ignore_eos": np.array([[True]])}
    (result,), _ = grpc_stream(triton.grpc, "llm_tokens", inputs)
    assert result.as_numpy("output_ids").tolist() == [[ref.token_ids]]
    assert result.as_numpy("sequence_length").tolist() == [[6]]
    results, finals = grpc_stream(triton.grpc, "llm_tokens", {**inputs, "streaming": np.array([[True]])})
    assert finals == 1 and len(results) > 1
    assert sum((r.as_numpy("output_ids")[0, 0].tolist() for r in results), []) == ref.token_ids


def test_http_infer_on_bls_bad_input_is_400(triton):
    status, raw = http_post(triton.http, "/v2/models/llm_bls/infer", {"inputs": [
        {"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["x"]},
        {"name": "sampling_parameters", "shape": [1], "datatype": "BYTES", "data": ['{"top_p": "2"}']}]})
    assert status == 400 and "top_p" in json.loads(raw)["error"]


# -- explicit model control -------------------------------------------------------------------


def test_unload_load_and_second_version(triton):
    """Unload the BLS front (its stub exits), write version 2, load it: v2 serves, v1 is gone."""
    import tritonclient.http as httpclient

    from triton_helpers import stub_pids
    from tritongen.triton.repo import write_repository

    client = httpclient.InferenceServerClient(triton.http)
    bls_stubs = lambda: [p for p in stub_pids(triton.repo / "llm_bls")]  # noqa: E731
    assert len(bls_stubs()) == 1
    client.unload_model("llm_bls")
    deadline = time.monotonic() + 30
    while (bls_stubs() or client.is_model_ready("llm_bls")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not client.is_model_ready("llm_bls") and not bls_stubs()
    assert http_post(triton.http, "/v2/models/llm_bls/generate", {"text_input": "x"})[0] != 200
    from triton_helpers import TINY

    write_repository(triton.repo, TINY, version=2)
    client.load_model("llm_bls")
    assert client.is_model_ready("llm_bls", "2") and not client.is_model_ready("llm_bls", "1")
    out = generate(triton.http, "llm_bls", {"text_input": "again", "max_tokens": 3})
    assert out["model_version"] == "2" and out["text_output"]
    assert len(bls_stubs()) == 1
