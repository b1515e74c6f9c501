"""A corpus of malformed requests for every front, and what each must answer.

Each case is one wrong thing in an otherwise valid request, sent the way one client layout sends
it: Triton HTTP /generate (llm and llm_bls), HTTP /infer (llm_bls), gRPC stream (llm), gRPC unary
(llm_bls), and the OpenAI routes. The answer must be a client error (HTTP 400 / INVALID_ARG, gRPC
stream errors in band) whose message contains `needle`, and it must come at once.

Bodies Triton's own HTTP frontend cannot parse (a number where the config says BYTES, a JSON
parameter of the wrong type for a declared input, lone surrogates) never reach our models: Triton
answers them with HTTP 500 itself; docs/reliability.md lists them as upstream.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

# (what is wrong, sampling_parameters JSON text, text the error must contain)
_SAMPLING: list[tuple[str, str, str]] = [
    ("max_tokens zero", '{"max_tokens": 0}', "max_tokens"),
    ("max_tokens negative", '{"max_tokens": -5}', "max_tokens"),
    ("max_tokens word", '{"max_tokens": "many"}', "max_tokens"),
    ("max_tokens 1e30", '{"max_tokens": 1e30}', "max_tokens"),
    ("max_tokens 2**70", '{"max_tokens": %d}' % 2**70, "max_tokens"),
    ("max_tokens 5000 digits", '{"max_tokens": "%s"}' % ("1" * 5000), "max_tokens"),
    ("max_tokens list", '{"max_tokens": [1]}', "max_tokens"),
    ("max_tokens object", '{"max_tokens": {"a": 1}}', "max_tokens"),
    ("max_tokens bool", '{"max_tokens": true}', "max_tokens"),
    ("temperature negative", '{"temperature": -1}', "temperature"),
    ("temperature NaN", '{"temperature": "NaN"}', "temperature"),
    ("temperature inf", '{"temperature": "inf"}', "temperature"),
    ("temperature 1e400", '{"temperature": 1e400}', "temperature"),
    ("temperature word", '{"temperature": "hot"}', "temperature"),
    ("top_p zero", '{"top_p": 0}', "top_p"),
    ("top_p 1.5", '{"top_p": 1.5}', "top_p"),
    ("top_k -2", '{"top_k": -2}', "top_k"),
    ("top_k 1.5", '{"top_k": 1.5}', "top_k"),
    ("top_k 10**30", '{"top_k": %d}' % 10**30, "top_k"),
    ("min_p 2", '{"min_p": 2}', "min_p"),
    ("repetition_penalty 0", '{"repetition_penalty": 0}', "repetition_penalty"),
    ("presence_penalty 5", '{"presence_penalty": 5}', "presence_penalty"),
    ("frequency_penalty -3", '{"frequency_penalty": -3}', "frequency_penalty"),
    ("seed 2**64", '{"seed": 18446744073709551616}', "seed"),
    ("seed below -2**63", '{"seed": -9223372036854775809}', "seed"),
    ("seed 1.5", '{"seed": 1.5}', "seed"),
    ("seed word", '{"seed": "x"}', "seed"),
    ("min_tokens -1", '{"min_tokens": -1}', "min_tokens"),
    ("min_tokens above max_tokens", '{"min_tokens": 100, "max_tokens": 4}', "min_tokens"),
    ("logprobs 100", '{"logprobs": 100}', "logprobs"),
    ("stop number", '{"stop": 5}', "stop"),
    ("stop empty string", '{"stop": [""]}', "stop"),
    ("stop nested", '{"stop": [["x"]]}', "stop"),
    ("stop_token_ids negative", '{"stop_token_ids": [-1]}', "stop_token_ids"),
    ("stop_token_ids words", '{"stop_token_ids": "abc"}', "stop_token_ids"),
    ("n 2", '{"n": 2}', "n"),
    ("best_of 3", '{"best_of": 3}', "best_of"),
    ("beam search", '{"use_beam_search": true}', "use_beam_search"),
    ("unknown key", '{"tempreature": 1}', "tempreature"),
    ("ignore_eos maybe", '{"ignore_eos": "maybe"}', "ignore_eos"),
    ("not JSON", "{max_tokens: 4", "sampling_parameters"),
    ("JSON array", "[1, 2]", "sampling_parameters"),
    ("JSON null", "null", "sampling_parameters"),
    ("nested 5000 deep", "[" * 5000 + "]" * 5000, "sampling_parameters"),
    ("object nested 5000 deep", '{"a": ' * 5000 + "1" + "}" * 5000, "sampling_parameters"),
    ("integer of 5000 digits", '{"max_tokens": %s}' % ("1" * 5000), "sampling_parameters"),
    ("100 kB", '{"stop": "%s"}' % ("s" * 100_000), "sampling_parameters"),
]
# (what is wrong, request fields beside the prompt (None: no prompt at all), needle)
_REQUEST: list[tuple[str, Optional[dict], str]] = [
    ("no prompt", None, "text_input"),
    ("prompt too long", {"text_input": "hello " * 3000}, "max_model_len"),
    ("empty prompt", {"text_input": ""}, "text_input"),
    ("beam_width 2", {"beam_width": 2}, "beam_width"),
    ("bad_words", {"bad_words": ["no"]}, "bad_words"),
    ("end_id negative", {"end_id": -1}, "end_id"),
    ("forged abort", {"abort_request_id": "llm_bls-1-0"}, "abort_request_id"),
]
_TYPES = {"text_input": "BYTES", "sampling_parameters": "BYTES", "beam_width": "INT32", "bad_words": "BYTES",
          "end_id": "INT32", "abort_request_id": "BYTES", "max_tokens": "INT32"}


@dataclass(frozen=True)
class Case:
    front: str
    """triton-generate | triton-infer | triton-grpc-stream | triton-grpc-unary | openai"""
    model: str
    name: str
    """What is wrong."""
    fields: dict = field(hash=False)
    """Triton: input name -> value (one element each, or a list); OpenAI: the JSON body."""
    needle: str
    path: str = ""
    """OpenAI route."""


def triton_cases(models: tuple[str, str] = ("llm", "llm_bls")) -> list[Case]:
    """Every wrong thing on every Triton path: generate on both models, infer and gRPC unary on
    the non-decoupled one, the gRPC stream on the decoupled one."""
    engine, bls = models
    fronts = [("triton-generate", engine), ("triton-generate", bls), ("triton-infer", bls),
              ("triton-grpc-stream", engine), ("triton-grpc-unary", bls)]
    cases = []
    for front, model in fronts:
        for name, raw, needle in _SAMPLING:
            cases.append(Case(front, model, name, {"text_input": "hi", "sampling_parameters": raw}, needle))
        for name, extra, needle in _REQUEST:
            fields = {"max_tokens": 4} if extra is None else {"text_input": "hi", **extra}
            cases.append(Case(front, model, name, fields, needle))
    return cases


def openai_cases(model: str) -> list[Case]:
    """Wrong fields for /v1/completions and /v1/chat/completions (the OpenAI API's own checks)."""
    bad: list[tuple[str, dict, str]] = [
        ("max_tokens string", {"max_tokens": "4"}, "max_tokens"), ("max_tokens bool", {"max_tokens": True}, "max_tokens"),
        ("max_tokens negative", {"max_tokens": -1}, "max_tokens"), ("temperature -1", {"temperature": -1}, "temperature"),
        ("temperature string", {"temperature": "hot"}, "temperature"), ("top_p 2", {"top_p": 2}, "top_p"),
        ("seed 2**64", {"seed": 2**64}, "seed"), ("n 0", {"n": 0}, "n"), ("n 2", {"n": 2}, "n"),
        ("logprobs 100", {"logprobs": 100}, "logprobs"), ("stop number", {"stop": 5}, "stop"),
        ("presence_penalty 9", {"presence_penalty": 9}, "presence_penalty"),
        ("unknown model", {"model": "no-such-model"}, "model"),
        ("stream string", {"stream": "yes"}, "stream"), ("top_k -5", {"top_k": -5}, "top_k"),
        ("min_p 3", {"min_p": 3}, "min_p"), ("logit_bias", {"logit_bias": {"1": 5}}, "logit_bias"),
        ("stop numbers", {"stop": [1, 2]}, "stop"), ("max_tokens 2**70", {"max_tokens": 2**70}, "max_tokens"),
    ]
    prompts: list[tuple[str, dict, str]] = [
        ("prompt bools", {"prompt": [True, False]}, "prompt"), ("prompt object", {"prompt": {"a": 1}}, "prompt"),
        ("prompt surrogate", {"prompt": "\ud800"}, "prompt"), ("prompt missing", {"prompt": None}, "prompt"),
        ("prompt too long", {"prompt": "hello " * 3000}, "prompt"),
    ]
    messages: list[tuple[str, dict, str]] = [
        ("role bogus", {"messages": [{"role": "bogus", "content": "hi"}]}, "role"),
        ("role empty", {"messages": [{"role": "", "content": "hi"}]}, "role"),
        ("messages string", {"messages": "hi"}, "messages"), ("messages empty", {"messages": []}, "messages"),
        ("content number", {"messages": [{"role": "user", "content": 5}]}, "content"),
    ]
    cases = []
    for name, extra, needle in bad + prompts:
        body = {"model": model, "prompt": "hi", "max_tokens": 4, **extra}
        cases.append(Case("openai", model, name, {k: v for k, v in body.items() if v is not None}, needle,
                          "/v1/completions"))
    for name, extra, needle in bad + messages:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
        cases.append(Case("openai", model, name, body, needle, "/v1/chat/completions"))
    return cases


def http_infer_body(fields: dict) -> dict:
    """KServe v2 /infer JSON for Triton inputs given as name -> value."""
    inputs = []
    for name, value in fields.items():
        data = value if isinstance(value, list) else [value]
        inputs.append({"name": name, "shape": [len(data)], "datatype": _TYPES.get(name, "BYTES"), "data": data})
    return {"inputs": inputs}


def grpc_arrays(fields: dict) -> dict[str, Any]:
    """numpy arrays for Triton inputs given as name -> value."""
    import numpy as np

    arrays = {}
    for name, value in fields.items():
        data = value if isinstance(value, list) else [value]
        if _TYPES.get(name, "BYTES") == "INT32":
            arrays[name] = np.array(data, dtype=np.int32)
        else:
            arrays[name] = np.array([str(v).encode("utf-8", "surrogatepass") for v in data], dtype=np.object_)
    return arrays


def describe(case: Case) -> str:
    return f"{case.front} {case.model}{case.path}: {case.name}"


def body_text(case: Case) -> str:
    return json.dumps(case.fields)
