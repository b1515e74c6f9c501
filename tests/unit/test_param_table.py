"""params.PARAMS is the one table of request parameters: every field of it exists in each front's
schema (the OpenAI request bodies, the Triton engine model's inputs and their TensorRT-LLM /
FasterTransformer aliases, the ensemble, the sampling_parameters JSON, `tritongen generate`) with
the table's type and default, and no front declares a sampling field the table lacks. The
bounds are checked once per request."""
import argparse
import os
import sys
import typing

import numpy as np
import pytest

from tritongen.params import BY_NAME, MAX_INT, PARAMS, SamplingParams

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "triton"))
import fake_pb_utils as pb  # noqa: E402

FIELDS = {p.name for p in PARAMS}


def test_the_table_is_samplingparams():
    assert [p.name for p in PARAMS] == list(SamplingParams.__dataclass_fields__)
    defaults = SamplingParams()
    for p in PARAMS:
        assert getattr(defaults, p.name) == p.default, p.name
        assert p.doc, f"{p.name} has no docstring"
        assert p.bounds is not None or p.kind is bool or p.is_list, f"{p.name} has no bounds"


# -- OpenAI -----------------------------------------------------------------------------------------

OPENAI_REQUEST_FIELDS = {"model", "n", "best_of", "stream", "stream_options", "logit_bias", "user",
                         "return_perf_metrics"}
"""What both endpoints take that is no sampling field (the request itself, or refused unless neutral)."""
OPENAI_ENDPOINT_FIELDS = {
    "CompletionRequest": {"prompt", "logprobs", "echo", "suffix"},
    "ChatCompletionRequest": {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools",
                              "response_format", "add_generation_prompt"},
}
"""Each endpoint's own fields: logprobs is spelled differently by each (an int; a bool + top_logprobs)."""


@pytest.mark.parametrize("model", ["CompletionRequest", "ChatCompletionRequest"])
def test_openai_schema_has_every_field_and_no_other_sampling_field(model):
    from tritongen.openai import protocol

    declared = getattr(protocol, model).model_fields
    for p in PARAMS:
        if not p.openai:
            continue
        f = declared[p.name]
        assert f.default == (None if p.openai_null else p.default), p.name
        assert (type(None) in typing.get_args(f.annotation)) == p.openai_null, p.name
    sampling = set(declared) - OPENAI_REQUEST_FIELDS - OPENAI_ENDPOINT_FIELDS[model]
    assert sampling == {p.name for p in PARAMS if p.openai}
    assert not (OPENAI_REQUEST_FIELDS & FIELDS)


def test_openai_absent_fields_map_to_the_table_defaults():
    from tritongen.openai import serving
    from tritongen.openai.protocol import CompletionRequest

    (job,) = serving.completion_jobs(CompletionRequest(prompt="hi"), lambda s: [1, 2], max_model_len=64)
    assert job.params == SamplingParams()
    explicit = {p.name: p.default for p in PARAMS if p.openai and p.default is not None}
    assert serving.completion_jobs(CompletionRequest(prompt="hi", **explicit), lambda s: [1, 2], 64)[0].params == \
        SamplingParams()


# -- Triton -----------------------------------------------------------------------------------------

TRITON_OTHER_INPUTS = {
    "text_input", "input_ids", "input_lengths", "stream", "streaming", "sampling_parameters", "exclude_input_in_output",
    "end_id", "pad_id", "beam_width", "len_penalty", "length_penalty", "bad_words", "stop_words_list", "bad_words_list",
    "return_logprobs", "return_log_probs", "is_return_log_probs", "return_perf_metrics", "return_cumulative_logprob",
    "return_finish_reason", "return_num_input_tokens", "return_num_output_tokens", "return_context_logits",
    "return_generation_logits", "num_return_sequences", "lora_task_id", "lora_weights", "lora_config",
    "prompt_embedding_table", "prompt_vocab_size", "abort_request_id"}
"""The engine model's inputs that set no SamplingParams field by themselves (end_id and
stop_words_list add stop ids, the return_* flags ask for outputs, the rest is refused or inert)."""

_NUMPY = {"TYPE_INT32": np.int32, "TYPE_UINT64": np.uint64, "TYPE_FP32": np.float32, "TYPE_BOOL": np.bool_}


def test_triton_inputs_have_every_field_and_alias_and_no_other_sampling_input():
    from tritongen.triton import codec

    by_name = {s.name: s for s in codec.INPUTS}
    assert len(by_name) == len(codec.INPUTS)
    for p in PARAMS:
        for name in p.tensor_names:
            assert (by_name[name].data_type, by_name[name].dims) == (p.triton, p.dims), name
    assert set(by_name) - TRITON_OTHER_INPUTS == codec.SAMPLING_INPUT_NAMES
    assert not (TRITON_OTHER_INPUTS & FIELDS)
    assert set(codec._JSON_PARAMS) == {p.name for p in PARAMS if p.json}


def _sample(p):
    """A value of `p` other than its default, within its bounds."""
    return {"max_tokens": 7, "temperature": 0.5, "top_p": 0.5, "top_k": 3, "min_p": 0.25, "repetition_penalty": 1.5,
            "presence_penalty": 0.5, "frequency_penalty": -0.5, "seed": 11, "min_tokens": 2, "ignore_eos": True,
            "stop": ["END"], "stop_token_ids": [9], "include_stop_str_in_output": True, "logprobs": 2,
            "prompt_logprobs": 1, "skip_special_tokens": False}[p.name]


@pytest.mark.parametrize("p", [p for p in PARAMS if p.triton], ids=lambda p: p.name)
def test_each_triton_tensor_and_alias_sets_its_field(p):
    from tritongen.triton import codec

    value = _sample(p)
    array = np.array([v.encode() for v in value], dtype=object) if p.is_list else np.array([value], _NUMPY[p.triton])
    for name in p.tensor_names:
        got = codec.parse_request(pb.InferenceRequest({"text_input": pb.text("x"), name: array}), pb).params
        assert getattr(got, p.name) == value, name


@pytest.mark.parametrize("p", [p for p in PARAMS if p.json], ids=lambda p: p.name)
def test_each_json_key_sets_its_field(p):
    import json

    from tritongen.triton import codec

    raw = pb.text(json.dumps({p.name: _sample(p)}))
    got = codec.parse_request(pb.InferenceRequest({"text_input": pb.text("x"), "sampling_parameters": raw}), pb)
    assert getattr(got.params, p.name) == _sample(p)


def test_triton_absent_inputs_are_the_table_defaults():
    from tritongen.triton import codec

    assert codec.parse_request(pb.InferenceRequest({"text_input": pb.text("x")}), pb).params == SamplingParams()


def test_fastertransformer_and_ensemble_carry_the_fields_they_name():
    from tritongen.triton import ensemble_models, layouts

    ft = {s.name: s for s in layouts.FT_INPUTS}
    ensemble = set(ensemble_models._ENSEMBLE_INPUTS)
    engine_names = {n for p in PARAMS for n in p.tensor_names}
    for p in PARAMS:
        if p.ft:
            spec = ft[p.ft.name]
            assert p.ft.name in p.tensor_names  # what the forwarder sends on is this field's input
            assert spec.data_type == (p.ft.data_type or p.triton) and spec.dims == (p.ft.dims or p.dims)
        if p.ensemble:
            assert p.ensemble in ensemble and p.ensemble in p.tensor_names
    assert {n for n in ft if n in engine_names} == {p.ft.name for p in PARAMS if p.ft}
    assert ensemble & engine_names == {p.ensemble for p in PARAMS if p.ensemble}
    assert "max_tokens" in ensemble_models.ensemble_config() and "random_seed" in ensemble_models.ensemble_config()


# -- tritongen generate -------------------------------------------------------------------------------

CLI_OTHER = {"help", "prompt", "stream", "chat"}


def _generate_parser() -> argparse.ArgumentParser:
    from tritongen.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["generate"]


def test_cli_generate_has_every_flag_and_no_other_sampling_flag():
    from tritongen.config_cli import engine_kwargs

    g = _generate_parser()
    flags = {o: a for a in g._actions for o in a.option_strings}
    for p in PARAMS:
        if p.cli:
            assert flags[p.cli].default == (None if p.is_list else p.cli_default), p.cli
    engine = set(engine_kwargs(argparse.Namespace(**{a.dest: None for a in g._actions})))
    sampling = {a.dest for a in g._actions} - CLI_OTHER - engine
    assert sampling == {p.cli[2:].replace("-", "_") for p in PARAMS if p.cli}


def test_cli_generate_defaults_and_flags_build_samplingparams():
    from tritongen.cli import _sampling_params

    g = _generate_parser()
    overrides = {p.name: p.cli_default for p in PARAMS if p.cli and p.cli_default != p.default}
    assert _sampling_params(g.parse_args(["x"])) == SamplingParams(**overrides) == \
        SamplingParams(max_tokens=64, temperature=0.0)
    args = g.parse_args(["x", "--top-k", "3", "--stop", "a", "--stop", "b", "--stop-token-id", "9", "--ignore-eos",
                         "--no-skip-special-tokens", "--sampling-seed", "11"])
    p = _sampling_params(args)
    assert (p.top_k, p.stop, p.stop_token_ids, p.ignore_eos, p.skip_special_tokens, p.seed) == \
        (3, ["a", "b"], [9], True, False, 11)
    with pytest.raises(ValueError, match="^top_p"):
        _sampling_params(g.parse_args(["x", "--top-p", "0"]))


# -- bounds, checked once ---------------------------------------------------------------------------

@pytest.mark.parametrize("p", [p for p in PARAMS if p.bounds is not None], ids=lambda p: p.name)
def test_bounds_come_from_the_table(p):
    b = p.bounds
    extra = {"max_tokens": MAX_INT} if p.name == "min_tokens" else {}

    def make(value):
        return SamplingParams(**{p.name: value}, **extra)

    make(p.kind(b.high)).validate()
    if not b.low_open:
        make(p.kind(b.low)).validate()
    above = b.high + 1 if p.kind is int else b.high * 2
    for bad in (above, b.low - 1) + ((b.low,) if b.low_open else ()):
        with pytest.raises(ValueError, match=f"^{p.name} "):
            make(bad).validate()


def test_front_validated_params_are_not_checked_again(monkeypatch):
    from tritongen.openai import serving
    from tritongen.openai.protocol import CompletionRequest
    from tritongen.params import Param

    checked = []
    original = Param.check
    monkeypatch.setattr(Param, "check", lambda self, value: (checked.append(self.name), original(self, value))[1])
    (job,) = serving.completion_jobs(CompletionRequest(prompt="hi", stop_token_ids=[5]), lambda s: [1], 64)
    assert len(checked) == len(PARAMS) and job.params.validated
    job.params.validate(vocab_size=100)  # the engine's call: the vocabulary only
    assert len(checked) == len(PARAMS)
    with pytest.raises(ValueError, match=r"^stop_token_ids .*\[0, 4\]"):
        job.params.validate(vocab_size=5)
    job.params.top_p = 0.0  # a changed field is checked again
    assert not job.params.validated
    with pytest.raises(ValueError, match="^top_p"):
        job.params.validate(vocab_size=100)


def test_a_params_object_without_a_front_is_checked_entirely_by_the_engine_call():
    params = SamplingParams(top_p=0.0)
    assert not params.validated
    with pytest.raises(ValueError, match="^top_p"):
        params.validate(vocab_size=100)
    assert BY_NAME["top_p"].bounds.low_open
