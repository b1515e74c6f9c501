"""FasterTransformer's and TensorRT-LLM's client layouts against the real tritonserver: the seed's
FT client script, batches (each row its own engine request), tensorrt_llm's names streaming and
not, stop_words_list, refused inputs by name, and per-request perf metrics."""
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from triton_helpers import generate, generate_stream, grpc_inputs, grpc_stream, http_post
from tritongen import SamplingParams

CLIENTS = Path(__file__).resolve().parents[2] / "clients" / "python"
PROMPTS = ["The capital of France is", "Once upon a time, there was a", "The quick brown fox",
           "In 1969, the first man on the moon was"]


def greedy_ids(reference_llm, ids, n, **extra):
    return reference_llm.generate([ids], SamplingParams(temperature=0, max_tokens=n, **extra))[0].token_ids


def grpc():
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient


def padded(rows, dtype):
    out = np.zeros((len(rows), max(map(len, rows))), dtype=dtype)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out, np.array([[len(r)] for r in rows], dtype=dtype)


# -- FasterTransformer ------------------------------------------------------------------------


def test_seed_fastertransformer_client_batch_1_and_4(triton, reference_llm):
    out = subprocess.run([sys.executable, str(CLIENTS / "ft_client.py"), "--url", triton.grpc, "--model",
                          "fastertransformer"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "batch 1: output_ids shape [1, 1, " in out.stdout and "batch 4: output_ids shape [4, 1, " in out.stdout
    assert "row 0 of the batch equals the prompt sent alone: True" in out.stdout
    ids = [reference_llm.tokenizer.encode(p) for p in PROMPTS]
    for i, row in enumerate(ids):  # each row: its prompt, then what the engine generates for it alone
        want = row + greedy_ids(reference_llm, row, 8)
        assert f"  row {i}: {want} (prompt echoed: True" in out.stdout, out.stdout


def test_fastertransformer_types_and_padding(triton, reference_llm):
    ids = [reference_llm.tokenizer.encode(p) for p in PROMPTS[:2]]
    input_ids, lengths = padded(ids, np.uint32)
    result = grpc()(triton.grpc).infer("fastertransformer", grpc_inputs({
        "input_ids": input_ids, "input_lengths": lengths, "request_output_len": np.array([[4], [6]], np.uint32)}))
    output_ids, seq_len = result.as_numpy("output_ids"), result.as_numpy("sequence_length")
    assert output_ids.dtype == np.uint32 and seq_len.dtype == np.uint32
    assert seq_len.tolist() == [[len(ids[0]) + 4], [len(ids[1]) + 6]]
    assert output_ids.shape == (2, 1, max(len(ids[0]) + 4, len(ids[1]) + 6))
    for i, (row, n) in enumerate(zip(ids, (4, 6))):
        assert output_ids[i, 0, :seq_len[i, 0]].tolist() == row + greedy_ids(reference_llm, row, n)
        assert not output_ids[i, 0, seq_len[i, 0]:].any()  # padding
    excluded = grpc()(triton.grpc).infer("fastertransformer", grpc_inputs({
        "input_ids": input_ids[:1], "input_lengths": lengths[:1], "request_output_len": np.array([[4]], np.uint32),
        "exclude_input_in_output": np.array([[True]])}))
    assert excluded.as_numpy("output_ids").tolist() == [[greedy_ids(reference_llm, ids[0], 4)]]


# -- TensorRT-LLM -----------------------------------------------------------------------------


def test_tensorrt_llm_unary_batch_rows_equal_single_prompts(triton, reference_llm):
    ids = [reference_llm.tokenizer.encode(p) for p in PROMPTS]
    input_ids, lengths = padded(ids, np.int32)
    result = grpc()(triton.grpc).infer("tensorrt_llm", grpc_inputs({
        "input_ids": input_ids, "input_lengths": lengths, "request_output_len": np.full((4, 1), 6, np.int32),
        "end_id": np.full((4, 1), 2, np.int32), "pad_id": np.full((4, 1), 2, np.int32),
        "runtime_top_k": np.full((4, 1), 1, np.int32), "ignore_eos": np.full((4, 1), True)}))
    assert result.as_numpy("output_ids").shape == (4, 1, 6)
    assert result.as_numpy("sequence_length").tolist() == [[6]] * 4
    assert result.as_numpy("output_ids")[:, 0].tolist() == [
        greedy_ids(reference_llm, row, 6, ignore_eos=True, stop_token_ids=[2]) for row in ids]


def test_tensorrt_llm_stop_words_list_streaming_and_not(triton, reference_llm):
    ids = reference_llm.tokenizer.encode(PROMPTS[0])
    full = greedy_ids(reference_llm, ids, 10, ignore_eos=True)
    stop = full[3:5]  # a two-token stop word, then a one-token one that never comes
    words = np.array([[stop + [49000], [2, 3, -1]]], np.int32)  # ids, end offsets, -1 padded
    inputs = {"input_ids": np.array([ids], np.int32), "input_lengths": np.array([[len(ids)]], np.int32),
              "request_output_len": np.array([[10]], np.int32), "ignore_eos": np.array([[True]]),
              "stop_words_list": words, "return_finish_reason": np.array([[True]])}
    (unary,), _ = grpc_stream(triton.grpc, "llm_tokens", inputs)
    assert unary.as_numpy("output_ids").tolist() == [[full[:5]]]  # ends with the stop word's ids
    assert unary.as_numpy("finish_reason").tolist() == [[b"stop"]]
    streamed, finals = grpc_stream(triton.grpc, "llm_tokens", {**inputs, "streaming": np.array([[True]])})
    assert finals == 1 and sum((r.as_numpy("output_ids")[0, 0].tolist() for r in streamed), []) == full[:5]


def test_ensemble_unary_batch_and_http_infer(triton, reference_llm):
    refs = reference_llm.generate(PROMPTS[:3], SamplingParams(temperature=0, max_tokens=6))
    batch = np.array([[p.encode()] for p in PROMPTS[:3]], dtype=np.object_)
    result = grpc()(triton.grpc).infer("ensemble", grpc_inputs({
        "text_input": batch, "max_tokens": np.full((3, 1), 6, np.int32)}))
    assert [t[0].decode() for t in result.as_numpy("text_output")] == [r.text for r in refs]
    status, raw = http_post(triton.http, "/v2/models/ensemble/infer", {"inputs": [
        {"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": [PROMPTS[0]]},
        {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [6]}]})
    assert status == 200, raw
    (text_output,) = [o for o in json.loads(raw)["outputs"] if o["name"] == "text_output"]
    assert text_output["data"] == [refs[0].text]


def test_tensorrt_llm_bls_layout(triton, reference_llm):
    ref = reference_llm.generate([PROMPTS[2]], SamplingParams(temperature=0, max_tokens=8))[0]
    body = {"text_input": PROMPTS[2], "max_tokens": 8}  # no sampling inputs: greedy, prompt not echoed
    assert generate(triton.http, "tensorrt_llm_bls", body)["text_output"] == ref.text
    events = generate_stream(triton.http, "tensorrt_llm_bls", {**body, "stream": True})
    assert "".join(e["text_output"] for e in events) == ref.text


@pytest.mark.parametrize("model,body,needle", [
    ("tensorrt_llm_bls", {"lora_task_id": 3}, "'lora_task_id' is not supported"),
    ("tensorrt_llm_bls", {"return_generation_logits": True}, "'return_generation_logits' is not supported"),
    ("ensemble", {"return_context_logits": True}, "'return_context_logits' is not supported"),
    ("ensemble", {"beam_width": 2}, "'beam_width' must be 1"),
    ("ensemble", {"num_return_sequences": 2}, "'num_return_sequences' is not supported"),
    ("ensemble", {"stream": True}, "'stream' is true but model 'tensorrt_llm' answers once"),
])
def test_unsupported_inputs_are_refused_by_name(triton, model, body, needle):
    status, raw = http_post(triton.http, f"/v2/models/{model}/generate", {"text_input": "x", **body})
    assert status == 400 and needle in json.loads(raw)["error"], raw


def test_unsupported_tensors_are_invalid_argument(triton):
    from tritonclient.utils import InferenceServerException

    ids = {"input_ids": np.array([[5, 6]], np.int32)}
    for extra, needle in ((({"bad_words_list": np.array([[[7], [1]]], np.int32)}), "'bad_words_list' is not supported"),
                          ({"lora_weights": np.zeros((1, 2, 2), np.float16)}, "'lora_weights' is not supported"),
                          ({"streaming": np.array([[True]])}, "'streaming' is true")):
        with pytest.raises(InferenceServerException) as info:
            grpc()(triton.grpc).infer("tensorrt_llm", grpc_inputs({**ids, **extra}))
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and needle in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        grpc()(triton.grpc).infer("fastertransformer", grpc_inputs({
            "input_ids": np.array([[5, 6]], np.uint32), "input_lengths": np.array([[2], [2]], np.uint32)}))
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "batch" in info.value.message()


# -- perf metrics -----------------------------------------------------------------------------

TIMES = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")


def check_perf(got: dict, before: int, after: int) -> None:
    """Monotonic, inside the client's own window (the same host's wall clock), blocks add up."""
    times = [int(got[n]) for n in TIMES]
    assert before <= times[0] <= times[1] <= times[2] <= times[3] <= after, (before, times, after)
    assert int(got["kv_cache_alloc_new_blocks"]) + int(got["kv_cache_reused_blocks"]) == \
        int(got["kv_cache_alloc_total_blocks"]) >= 1


@pytest.mark.parametrize("model", ["llm", "llm_bls", "ensemble", "tensorrt_llm_bls"])
def test_perf_metrics_generate(triton, model):
    before = time.time_ns()
    got = generate(triton.http, model, {"text_input": "perf " + model, "max_tokens": 5, "ignore_eos": True,
                                        "return_perf_metrics": True})
    check_perf(got, before, time.time_ns())
    assert int(got["last_token_time_ns"]) > int(got["first_token_time_ns"])  # 5 tokens, 5 steps


def test_perf_metrics_token_models_and_prefix_reuse(triton):
    prompt = list(range(100, 164))  # 64 tokens: 4 full blocks of 16
    inputs = {"input_ids": np.array([prompt], np.int32), "request_output_len": np.array([[3]], np.int32),
              "return_perf_metrics": np.array([[True]])}
    before = time.time_ns()
    (first,), _ = grpc_stream(triton.grpc, "llm_tokens", inputs)
    check_perf({n: first.as_numpy(n)[0, 0] for n in TIMES + ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks",
                                                            "kv_cache_alloc_total_blocks")}, before, time.time_ns())
    before = time.time_ns()
    again = grpc()(triton.grpc).infer("tensorrt_llm", grpc_inputs(inputs))
    got = {n: again.as_numpy(n)[0, 0] for n in TIMES + ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks",
                                                         "kv_cache_alloc_total_blocks")}
    check_perf(got, before, time.time_ns())
    assert got["kv_cache_reused_blocks"] >= 3  # the same prompt again: its full blocks come from the prefix cache


def test_genai_perf_tensorrtllm_payloads(triton, reference_llm):
    """What genai-perf 0.0.16 `--backend tensorrtllm` has perf_analyzer send (its converter:
    text_input, max_tokens, exclude_input_in_output, min_length with fixed output lengths, stream
    with --streaming; one prompt per request, batch dimension 1), unary to `ensemble` and streamed
    to `tensorrt_llm_bls`. genai-perf itself needs a perf_analyzer binary no wheel here ships."""
    ref = reference_llm.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=6, min_tokens=6))[0]
    payload = {"text_input": np.array([[PROMPTS[1].encode()]], np.object_), "max_tokens": np.array([[6]], np.int32),
               "exclude_input_in_output": np.array([[True]]), "min_length": np.array([[6]], np.int32)}
    result = grpc()(triton.grpc).infer("ensemble", grpc_inputs(payload))
    assert result.as_numpy("text_output").tolist() == [[ref.text.encode()]]
    results, finals = grpc_stream(triton.grpc, "tensorrt_llm_bls", {**payload, "stream": np.array([[True]])})
    assert finals == 1 and len(results) > 1
    assert "".join(r.as_numpy("text_output")[0, 0].decode() for r in results) == ref.text
