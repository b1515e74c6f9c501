"""The tensor codec against a fake pb_utils: no Triton, no model."""
import json

import numpy as np
import pytest

import fake_pb_utils as pb
from tritongen.triton import codec, errors
from tritongen.types import RequestOutput, SamplingParams, TokenLogprob


def parse(parameters=None, **inputs):
    return codec.parse_request(pb.InferenceRequest(inputs, parameters), pb)


def out(**kw):
    base = dict(request_id="r", prompt_token_ids=[1, 2, 3], text="hello world", token_ids=[5, 6],
                delta_text=" world", delta_token_ids=[6], finish_reason="length", prompt="Hi")
    base.update(kw)
    return RequestOutput(**base)


def test_vllm_layout_with_string_values():
    req = parse(text_input=pb.text("Hi"), stream=np.array([True]), sampling_parameters=pb.text(json.dumps(
        {"max_tokens": "8", "temperature": "0", "top_p": "0.5", "ignore_eos": "true", "stop": "END", "n": "1",
         "stop_token_ids": "[7, 9]", "seed": 3})))
    assert req.prompt == "Hi" and req.stream
    p = req.params
    assert (p.max_tokens, p.temperature, p.top_p, p.ignore_eos, p.stop, p.stop_token_ids, p.seed) == \
        (8, 0.0, 0.5, True, ["END"], [7, 9], 3)
    assert req.echo_prompt  # vllm_backend echoes the prompt unless exclude_input_in_output


def test_trtllm_layout_tensors():
    req = parse(text_input=np.array([[b"Hi"]], dtype=object), max_tokens=np.array([[4]], dtype=np.int32),
                temperature=np.array([[0.0]], dtype=np.float32), top_p=np.array([[0.0]], dtype=np.float32),
                top_k=np.array([[0]], dtype=np.int32), stop_words=np.array([[b"", b"STOP"]], dtype=object),
                bad_words=np.array([[b""]], dtype=object), random_seed=np.array([[7]], dtype=np.uint64),
                min_length=np.array([[2]], dtype=np.int32), end_id=np.array([[2]], dtype=np.int32),
                beam_width=np.array([[1]], dtype=np.int32))
    p = req.params
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.stop, p.seed, p.min_tokens, p.stop_token_ids) == \
        (4, 0.0, 1.0, 0, ["STOP"], 7, 2, [2])
    assert not req.echo_prompt and not req.stream


def test_generate_endpoint_parameters_and_precedence():
    req = parse({"temperature": 0.5, "max_tokens": 9, "stream": True, "triton_enable_empty_final_response": True,
                 "unrelated": 1}, text_input=pb.text("x"), max_tokens=np.array([3], dtype=np.int32))
    assert req.params.temperature == 0.5 and req.params.max_tokens == 3 and req.stream


def test_token_mode_and_input_lengths():
    req = parse(input_ids=np.array([[5, 6, 7, 0]], dtype=np.int32), input_lengths=np.array([[3]], dtype=np.int32),
                request_output_len=np.array([[2]], dtype=np.int32))
    assert req.prompt == [5, 6, 7] and req.outputs.output_ids and not req.echo_prompt
    assert req.params.max_tokens == 2


def test_exclude_input_in_output_decides():
    assert not parse(text_input=pb.text("x"), exclude_input_in_output=np.array([True])).echo_prompt
    assert parse(text_input=pb.text("x"), exclude_input_in_output=np.array([False]),
                 stop_words=np.array([b""], dtype=object)).echo_prompt


@pytest.mark.parametrize("inputs,parameters,needle", [
    ({}, None, "'text_input' or 'input_ids'"),
    ({"text_input": pb.text("")}, None, "'text_input' is empty"),
    ({"text_input": np.array([b"\xff\xfe"], dtype=object)}, None, "'text_input' is not valid UTF-8"),
    ({"text_input": pb.text("x"), "sampling_parameters": pb.text("{bad")}, None, "'sampling_parameters' is not valid JSON"),
    ({"text_input": pb.text("x"), "sampling_parameters": pb.text("[1]")}, None, "must be a JSON object"),
    ({"text_input": pb.text("x"), "sampling_parameters": pb.text('{"max_tokens": "many"}')}, None,
     "'sampling_parameters.max_tokens' must be an integer"),
    ({"text_input": pb.text("x"), "sampling_parameters": pb.text('{"tempreature": 1}')}, None,
     "unknown sampling parameter 'sampling_parameters.tempreature'"),
    ({"text_input": pb.text("x"), "sampling_parameters": pb.text('{"n": 2}')}, None, "'sampling_parameters.n' must be 1"),
    ({"text_input": pb.text("x"), "temperature": np.array([-1.0], dtype=np.float32)}, None, "temperature"),
    ({"text_input": pb.text("x"), "temperature": np.array([np.nan], dtype=np.float32)}, None, "'temperature'"),
    ({"text_input": pb.text("x"), "max_tokens": np.array([0], dtype=np.int32)}, None, "max_tokens"),
    ({"text_input": pb.text("x"), "max_tokens": pb.text("3")}, None, "'max_tokens' must be an integer tensor"),
    ({"text_input": pb.text("x"), "max_tokens": np.array([1, 2], dtype=np.int32)}, None, "'max_tokens' must hold one"),
    ({"text_input": pb.text("x"), "top_k": np.array([1.5], dtype=np.float32)}, None, "'top_k' must be an integer"),
    ({"text_input": pb.text("x"), "beam_width": np.array([4], dtype=np.int32)}, None, "'beam_width' must be 1"),
    ({"text_input": pb.text("x"), "bad_words": np.array([b"no"], dtype=object)}, None, "'bad_words' is not supported"),
    ({"input_ids": np.array([1.5], dtype=np.float32)}, None, "'input_ids' must be an integer tensor"),
    ({"input_ids": np.array([3, 4], dtype=np.int32), "input_lengths": np.array([5], dtype=np.int32)}, None,
     "'input_lengths' (5) must be in [1, 2]"),
    ({"text_input": pb.text("x")}, {"max_tokens": "lots"}, "'parameters.max_tokens' must be an integer"),
])
def test_bad_input_names_the_problem(inputs, parameters, needle):
    with pytest.raises(codec.InvalidInput) as info:
        parse(parameters, **inputs)
    assert needle in str(info.value)


def test_non_streamed_response_echoes_prompt_and_optional_outputs():
    req = parse(text_input=pb.text("Hi"), return_finish_reason=np.array([True]),
                return_num_input_tokens=np.array([True]), return_num_output_tokens=np.array([True]))
    resp = codec.make_response(out(), req, pb)
    assert resp.get("text_output").tolist() == [b"Hihello world"]
    assert resp.get("finish_reason").tolist() == [b"length"]
    assert resp.get("num_input_tokens").tolist() == [3] and resp.get("num_output_tokens").tolist() == [2]
    assert resp.get("num_output_tokens").dtype == np.uint32
    assert "output_ids" not in resp.names() and "logprobs" not in resp.names()


def test_streamed_response_is_the_delta_with_batch_dim():
    req = parse(input_ids=np.array([[1, 2, 3]], dtype=np.int32), stream=np.array([[True]]))
    resp = codec.make_response(out(finish_reason=None), req, pb, batch_dim=True)
    assert resp.get("text_output").tolist() == [[b" world"]]
    assert resp.get("output_ids").tolist() == [[6]] and resp.get("sequence_length").tolist() == [[1]]


def test_logprobs_outputs():
    req = parse(text_input=pb.text("Hi"), return_logprobs=np.array([True]), return_cumulative_logprob=np.array([True]),
                return_log_probs=np.array([True]))
    assert req.params.logprobs == 0  # asked for implicitly
    lps = [TokenLogprob(5, -0.5, [(5, -0.5), (9, -1.0)]), TokenLogprob(6, -2.0, [(8, -1.0)])]
    resp = codec.make_response(out(logprobs=lps, cumulative_logprob=-2.5), req, pb, decode=lambda t: f"<{t}>")
    entries = json.loads(resp.get("logprobs")[0])
    assert entries[0]["5"] == {"logprob": -0.5, "rank": 1, "decoded_token": "<5>"} and entries[0]["9"]["rank"] == 2
    assert entries[1]["6"]["rank"] is None and entries[1]["8"]["rank"] == 1
    assert resp.get("cumulative_logprob").tolist() == [-2.5] and resp.get("cum_log_probs").tolist() == [-2.5]
    assert resp.get("output_log_probs").tolist() == [-0.5, -2.0]


def test_error_response_and_codes():
    resp = errors.error_response(pb, "input 'x' is bad")
    assert resp.error().code() == pb.TritonError.INVALID_ARG and "input 'x'" in resp.error().message()
    from tritongen.entrypoints.async_engine import EngineDeadError
    assert errors.error_code_for(ValueError("prompt too long")) == "INVALID_ARG"
    assert errors.error_code_for(EngineDeadError("down")) == "UNAVAILABLE"
    assert errors.error_code_for(RuntimeError("boom")) == "INTERNAL"


def test_abort_control_request():
    assert codec.abort_target(pb.InferenceRequest({"abort_request_id": pb.text("bls-1")}), pb) == "bls-1"
    assert codec.abort_target(pb.InferenceRequest({"text_input": pb.text("x")}), pb) is None


def test_every_sampling_field_reachable_from_json():
    settable = set(codec._JSON_PARAMS)
    fields = set(SamplingParams.__dataclass_fields__)
    assert settable <= fields


# -- TensorRT-LLM / FasterTransformer extras ----------------------------------------------------


def test_word_lists_ids_and_offsets():
    from tritongen.triton.trtllm import word_lists

    assert word_lists(np.array([[5, 6, 7, 0], [2, 3, -1, -1]], np.int32), "stop_words_list") == [[5, 6], [7]]
    assert word_lists(np.array([[[0], [-1]]], np.int32), "bad_words_list") == []
    for bad in (np.array([[5, 6], [3, -1]], np.int32), np.array([[5, 6], [2, 1]], np.int32),
                np.array([[5, 6, 7]], np.int32)):
        with pytest.raises(codec.InvalidInput, match="stop_words_list"):
            word_lists(bad, "stop_words_list")


def test_tensorrt_llm_names():
    req = parse(input_ids=np.array([5, 6, 7], np.int32), runtime_top_k=np.array([4], np.int32),
                runtime_top_p=np.array([0.0], np.float32), temperature=np.array([0.5], np.float32),
                streaming=np.array([True]), len_penalty=np.array([1.2], np.float32),
                stop_words_list=np.array([[9, 10, 11], [1, 3, -1]], np.int32),
                return_perf_metrics=np.array([True]))
    p = req.params
    assert (p.top_k, p.top_p, p.temperature, p.stop_token_ids) == (4, 1.0, 0.5, [9])
    assert req.stream and req.stop_sequences == [[10, 11]] and req.outputs.perf_metrics


def test_token_and_trtllm_requests_are_greedy_without_sampling_inputs():
    assert parse(input_ids=np.array([5, 6], np.int32)).params.temperature == 0.0
    assert parse(text_input=pb.text("x"), request_output_len=np.array([3], np.int32)).params.temperature == 0.0
    assert parse(text_input=pb.text("x"), parameters={codec.LAYOUT_PARAMETER: "trtllm"}).params.temperature == 0.0
    assert parse(text_input=pb.text("x")).params.temperature == SamplingParams().temperature  # vllm layout
    assert parse(input_ids=np.array([5], np.int32), runtime_top_k=np.array([5], np.int32)).params.temperature == 1.0


@pytest.mark.parametrize("name,value,needle", [
    ("return_context_logits", np.array([True]), "context logits"),
    ("return_generation_logits", np.array([True]), "generation logits"),
    ("num_return_sequences", np.array([2], np.int32), "one sequence"),
    ("lora_task_id", np.array([1], np.uint64), "LoRA"),
    ("lora_weights", np.zeros((1, 4), np.float16), "LoRA"),
    ("prompt_embedding_table", np.zeros((1, 4), np.float16), "prompt tuning"),
    ("bad_words_list", np.array([[7], [1]], np.int32), "bad_words_list"),
])
def test_unsupported_inputs_refused_by_name(name, value, needle):
    with pytest.raises(codec.InvalidInput, match=f"'{name}' is not supported.*{needle}|{needle}"):
        parse(input_ids=np.array([5], np.int32), **{name: value})
    parse(input_ids=np.array([5], np.int32), return_context_logits=np.array([False]),
          num_return_sequences=np.array([1], np.int32))  # the values that ask for nothing are fine


def test_echoed_ids_and_perf_outputs():
    from tritongen.triton.trtllm import PerfMetrics
    from tritongen.types import RequestTimes

    req = parse(input_ids=np.array([1, 2, 3], np.int32), exclude_input_in_output=np.array([False]),
                return_perf_metrics=np.array([True]))
    perf = PerfMetrics(100)
    o = out(num_cached_tokens=16, prompt_token_ids=list(range(20)), times=RequestTimes(0.0, 1e-7))
    perf.update(o, 300, 16)
    resp = codec.make_response(o, req, pb, perf=perf)
    assert resp.get("output_ids").tolist() == [1, 2, 3, 5, 6] and resp.get("sequence_length").tolist() == [5]
    assert resp.get("arrival_time_ns").tolist() == [100] and resp.get("first_scheduled_time_ns").tolist() == [100]
    assert resp.get("first_token_time_ns").tolist() == [300]
    assert (resp.get("kv_cache_reused_blocks")[0], resp.get("kv_cache_alloc_total_blocks")[0],
            resp.get("kv_cache_alloc_new_blocks")[0]) == (1, 2, 1)


def test_batch_rows_cast_and_padding():
    from tritongen.triton import layouts

    assert layouts.engine_row("input_ids", np.array([5, 6], np.uint32)).dtype == np.int32
    assert layouts.engine_row("input_ids", np.array([2**31], np.uint32)) is None
    stacked = layouts.stack_rows("output_ids", [np.array([1, 2, 3]), np.array([4])], np.uint32, pad_value=9)
    assert stacked.shape == (2, 1, 3) and stacked.tolist() == [[[1, 2, 3]], [[4, 9, 9]]]
    assert layouts.stack_rows("text_output", [np.array([b"a"], object)] * 2, np.object_).shape == (2, 1)
