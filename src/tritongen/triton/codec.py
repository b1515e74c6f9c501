"""Triton tensors <-> engine types. Pure translation: no Triton, no torch.

`pb` is the `triton_python_backend_utils` module inside Triton, or a fake in tests; only
`get_input_tensor_by_name`, `Tensor`, `InferenceResponse` and `TritonError` are used.

One request format serves clients of both common Triton LLM backends:
- vllm_backend: text_input, stream, sampling_parameters (JSON, values may be strings, e.g.
  {"max_tokens": "8"}), exclude_input_in_output, return_* flags; with HTTP /generate the
  sampling parameters may also come as request parameters ({"parameters": {...}}).
- TensorRT-LLM (ensemble, tensorrt_llm, tensorrt_llm_bls) and FasterTransformer: text_input,
  max_tokens / request_output_len, temperature, top_k / runtime_top_k, top_p / runtime_top_p,
  stop_words, stop_words_list / bad_words_list (ids + offsets, trtllm.py), random_seed,
  min_length, end_id, pad_id, beam_width (1), streaming, return_log_probs, return_perf_metrics,
  ...; or token ids: input_ids (+ input_lengths) -> output_ids + sequence_length. Inputs for
  what we do not do (logits, LoRA, prompt tables, beam search) are refused by name.

Prompt echo: vllm_backend prepends the prompt to a non-streamed text_output unless
exclude_input_in_output is true; TensorRT-LLM never echoes it. So the default follows the
request's layout: a request with input_ids or any input only TensorRT-LLM clients send
(request_output_len, stop_words, bad_words, end_id, pad_id, beam_width, random_seed, min_length,
return_log_probs) is not echoed; exclude_input_in_output always decides when given (false on a
token request puts the prompt ids in front of output_ids, as FasterTransformer did).

Greedy by default in those layouts: a TensorRT-LLM or token request with none of temperature,
top_k, top_p (or their runtime_ names, or sampling_parameters) is greedy, as both backends are.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import numpy as np

from tritongen.triton.errors import TAG_ERRORS
from tritongen.triton.trtllm import PERF_OUTPUT_NAMES, PerfMetrics, refuse_unsupported, word_lists
from tritongen.triton.values import (TENSOR_KINDS, InvalidInput, convert, json_list, json_object,
                                     short)
from tritongen.params import BY_NAME, PARAMS, Param, SamplingParams
from tritongen.types import RequestOutput, TokenLogprob


@dataclass(frozen=True)
class TensorSpec:
    name: str
    data_type: str
    """config.pbtxt data type (TYPE_STRING, TYPE_INT32, ...)."""
    dims: tuple[int, ...]
    doc: str = ""


def _sampling_inputs() -> tuple[TensorSpec, ...]:
    """The input tensors of the SamplingParams fields (params.PARAMS), each followed by its aliases."""
    specs = []
    for p in PARAMS:
        if p.triton:
            zero = "; 0 means the default (TensorRT-LLM)" if "triton" in p.zero_default else ""
            specs.append(TensorSpec(p.name, p.triton, p.dims, f"SamplingParams.{p.name}{zero}"))
            specs += [TensorSpec(a, p.triton, p.dims, f"alias of {p.name}") for a in p.aliases]
    return tuple(specs)


INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_input", "TYPE_STRING", (1,), "prompt text (this or input_ids)"),
    TensorSpec("input_ids", "TYPE_INT32", (-1,), "prompt token ids (this or text_input)"),
    TensorSpec("input_lengths", "TYPE_INT32", (1,), "number of valid ids in input_ids"),
    TensorSpec("stream", "TYPE_BOOL", (1,), "send one response per new text (decoupled model only)"),
    TensorSpec("streaming", "TYPE_BOOL", (1,), "alias of stream (TensorRT-LLM)"),
    TensorSpec("sampling_parameters", "TYPE_STRING", (1,), "JSON object, vllm_backend layout"),
    TensorSpec("exclude_input_in_output", "TYPE_BOOL", (1,), "do not echo the prompt (non-streamed text)"),
) + _sampling_inputs() + (
    TensorSpec("end_id", "TYPE_INT32", (1,), "an extra token id that ends generation"),
    TensorSpec("pad_id", "TYPE_INT32", (1,), "accepted and ignored"),
    TensorSpec("beam_width", "TYPE_INT32", (1,), "must be 1"),
    TensorSpec("len_penalty", "TYPE_FP32", (1,), "beam search only: no effect at beam_width 1"),
    TensorSpec("length_penalty", "TYPE_FP32", (1,), "alias of len_penalty"),
    TensorSpec("bad_words", "TYPE_STRING", (-1,), "must be empty"),
    TensorSpec("stop_words_list", "TYPE_INT32", (2, -1), "stop token sequences: ids, end offsets (-1 padded)"),
    TensorSpec("bad_words_list", "TYPE_INT32", (2, -1), "must hold no word"),
    TensorSpec("return_logprobs", "TYPE_BOOL", (1,), "send logprobs (JSON)"),
    TensorSpec("return_log_probs", "TYPE_BOOL", (1,), "send cum_log_probs and output_log_probs"),
    TensorSpec("is_return_log_probs", "TYPE_BOOL", (1,), "alias of return_log_probs (FasterTransformer)"),
    TensorSpec("return_perf_metrics", "TYPE_BOOL", (1,), "send the request's timings and KV cache block counts"),
    TensorSpec("return_cumulative_logprob", "TYPE_BOOL", (1,)),
    TensorSpec("return_finish_reason", "TYPE_BOOL", (1,)),
    TensorSpec("return_num_input_tokens", "TYPE_BOOL", (1,)),
    TensorSpec("return_num_output_tokens", "TYPE_BOOL", (1,)),
    TensorSpec("return_context_logits", "TYPE_BOOL", (1,), "must be false"),
    TensorSpec("return_generation_logits", "TYPE_BOOL", (1,), "must be false"),
    TensorSpec("num_return_sequences", "TYPE_INT32", (1,), "must be 1"),
    TensorSpec("lora_task_id", "TYPE_UINT64", (1,), "refused (no LoRA)"),
    TensorSpec("lora_weights", "TYPE_FP16", (-1, -1), "refused (no LoRA)"),
    TensorSpec("lora_config", "TYPE_INT32", (-1, 3), "refused (no LoRA)"),
    TensorSpec("prompt_embedding_table", "TYPE_FP16", (-1, -1), "refused (no prompt tuning)"),
    TensorSpec("prompt_vocab_size", "TYPE_INT32", (1,), "refused (no prompt tuning)"),
    TensorSpec("abort_request_id", "TYPE_STRING", (1,),
               "reserved for tritongen's forwarding models (needs the engine model's secret token, "
               "triton/control.py); from a client: INVALID_ARG"),
)
"""The engine model's inputs: the prompt and request-level inputs, the sampling fields' tensors
(from params.PARAMS), then TensorRT-LLM's controls that are no SamplingParams field."""
SAMPLING_INPUT_NAMES = frozenset(n for p in PARAMS for n in p.tensor_names)

OUTPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_output", "TYPE_STRING", (-1,)),
    TensorSpec("output_ids", "TYPE_INT32", (-1,)),
    TensorSpec("sequence_length", "TYPE_INT32", (1,)),
    TensorSpec("finish_reason", "TYPE_STRING", (-1,)),
    TensorSpec("num_input_tokens", "TYPE_UINT32", (1,)),
    TensorSpec("num_output_tokens", "TYPE_UINT32", (1,)),
    TensorSpec("cumulative_logprob", "TYPE_FP32", (-1,)),
    TensorSpec("logprobs", "TYPE_STRING", (-1,)),
    TensorSpec("cum_log_probs", "TYPE_FP32", (-1,)),
    TensorSpec("output_log_probs", "TYPE_FP32", (-1,)),
) + tuple(TensorSpec(n, "TYPE_INT64" if n.endswith("_ns") else "TYPE_INT32", (1,), "with return_perf_metrics")
          for n in PERF_OUTPUT_NAMES)
INPUT_NAMES = frozenset(s.name for s in INPUTS)

# Scalar tensors that set a SamplingParams field: input name (or alias) -> its Param.
_SCALAR_PARAMS: dict[str, Param] = {n: p for p in PARAMS if p.triton and not p.is_list for n in p.tensor_names}
_STOP_INPUTS = BY_NAME["stop"].tensor_names
# Inputs that only TensorRT-LLM-style clients send (they never echo the prompt): the fields'
# aliases and TensorRT-LLM's own controls. Sampling names such as max_tokens or temperature are not
# among them: HTTP /generate turns vllm_backend-style {"parameters": {"max_tokens": 8}} into input
# tensors of the same names.
_TRTLLM_ONLY = tuple(a for p in PARAMS for a in p.aliases) + (
    "bad_words", "end_id", "pad_id", "beam_width", "return_log_probs", "is_return_log_probs", "streaming",
    "len_penalty", "length_penalty", "stop_words_list", "bad_words_list", "return_perf_metrics")
_SAMPLING_INPUTS = tuple(n for p in PARAMS if p.sets_sampling for n in p.tensor_names) + ("sampling_parameters",)
LAYOUT_PARAMETER = "tritongen_layout"
"""Request parameter a forwarding model sets to "trtllm" for its TensorRT-LLM-shaped clients
(tensorrt_llm_bls, the ensemble): their defaults (no echo, greedy) then apply to text requests too."""

# sampling_parameters JSON keys (vllm_backend layout) -> their Param.
_JSON_PARAMS: dict[str, Param] = {p.name: p for p in PARAMS if p.json}
# vLLM keys we accept only at the value that means "nothing special".
_JSON_FIXED: dict[str, Any] = {"n": 1, "best_of": 1, "use_beam_search": False}
# Request-level keys that may ride along in the JSON (generate endpoint "parameters").
_JSON_REQUEST_KEYS = frozenset({"stream", "exclude_input_in_output", "return_logprobs", "return_finish_reason",
                                "return_cumulative_logprob", "return_num_input_tokens",
                                "return_num_output_tokens"})


@dataclass
class OutputOptions:
    """Which optional outputs the client asked for."""

    output_ids: bool = False
    logprobs: bool = False
    trtllm_log_probs: bool = False
    cumulative_logprob: bool = False
    finish_reason: bool = False
    num_input_tokens: bool = False
    num_output_tokens: bool = False
    perf_metrics: bool = False


@dataclass
class ParsedRequest:
    prompt: Union[str, list[int]]
    params: SamplingParams
    stream: bool = False
    echo_prompt: bool = False
    """Prepend the prompt to a non-streamed output: its text to text_output (vllm_backend default),
    or for token prompts its ids to output_ids (exclude_input_in_output false, FasterTransformer)."""
    outputs: OutputOptions = field(default_factory=OutputOptions)
    stop_sequences: list[list[int]] = field(default_factory=list)
    """Multi-token stop words (stop_words_list); the engine model turns them into stop strings."""


# -- reading inputs ---------------------------------------------------------------------------


def _flat(request, pb, name: str) -> Optional[np.ndarray]:
    tensor = pb.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    return np.asarray(tensor.as_numpy()).reshape(-1)


def _scalar(request, pb, name: str, kind: type) -> Any:
    flat = _flat(request, pb, name)
    if flat is None or flat.size == 0:
        return None
    if flat.size > 1:
        raise InvalidInput(f"input '{name}' must hold one value, got {flat.size} (batch size must be 1)")
    if kind is not str and flat.dtype == np.object_:
        raise InvalidInput(f"input '{name}' must be {TENSOR_KINDS[kind]} tensor, got BYTES")
    return convert(flat[0], kind, name)


def _strings(request, pb, name: str) -> Optional[list[str]]:
    flat = _flat(request, pb, name)
    if flat is None:
        return None
    if flat.dtype != np.object_ and flat.dtype.kind not in "SU":
        raise InvalidInput(f"input '{name}' must be a BYTES tensor, got {flat.dtype}")
    return [s for s in (convert(v, str, name) for v in flat) if s]


def abort_target(request, pb) -> Optional[str]:
    """The request id named by a control request (input abort_request_id), else None."""
    return _scalar(request, pb, "abort_request_id", str)


def _prompt(request, pb) -> tuple[Union[str, list[int]], bool]:
    """(prompt, token_mode)."""
    ids = _flat(request, pb, "input_ids")
    if ids is not None:
        if ids.dtype.kind not in "iu":
            raise InvalidInput(f"input 'input_ids' must be an integer tensor, got {ids.dtype}")
        length = _scalar(request, pb, "input_lengths", int)
        if length is not None:
            if not 0 < length <= ids.size:
                raise InvalidInput(f"input 'input_lengths' ({length}) must be in [1, {ids.size}]")
            ids = ids[:length]
        if ids.size == 0:
            raise InvalidInput("input 'input_ids' is empty")
        return [int(t) for t in ids], True
    text = _scalar(request, pb, "text_input", str)
    if text is None:
        raise InvalidInput("one of the inputs 'text_input' or 'input_ids' is required")
    if not text:
        raise InvalidInput("input 'text_input' is empty")
    return text, False


def _apply_json(fields: dict, obj: dict, source: str, strict: bool) -> dict:
    """Copy sampling keys of `obj` into `fields`; return the request-level keys found."""
    extra = {}
    for key, value in obj.items():
        where = f"{source}.{short(key, 64, plain=True)}"
        if key in _JSON_PARAMS:
            p = _JSON_PARAMS[key]
            if value is None:
                continue
            fields[key] = json_list(value, p.kind, where) if p.is_list else convert(value, p.kind, where)
        elif key in _JSON_FIXED:
            expected = _JSON_FIXED[key]
            if convert(value, type(expected), where) != expected:
                raise InvalidInput(f"'{where}' must be {expected!r} (not supported otherwise), got {short(value)}")
        elif key in _JSON_REQUEST_KEYS:
            extra[key] = convert(value, bool, where)
        elif strict:
            raise InvalidInput(f"unknown sampling parameter '{source}.{short(key, 64, plain=True)}'; known: "
                               f"{', '.join(sorted(_JSON_PARAMS))}")
    return extra


def _request_parameters(request) -> dict:
    """Request parameters (HTTP /generate "parameters"); Triton's own keys are skipped."""
    getter = getattr(request, "parameters", None)
    if getter is None:
        return {}
    raw = getter()
    obj = json_object(raw if isinstance(raw, str) else json.dumps(raw or {}), "parameters")
    return {k: v for k, v in obj.items() if not k.startswith("triton_")}


def request_parameter(request, name: str) -> Any:
    """One request parameter (None when absent or the parameters cannot be read)."""
    try:
        return _request_parameters(request).get(name)
    except InvalidInput:
        return None


def _flag(request, pb, name: str, json_extra: dict, default: bool = False) -> bool:
    value = _scalar(request, pb, name, bool)
    if value is None:
        value = json_extra.get(name, default)
    return value


def parse_request(request, pb) -> ParsedRequest:
    """Read every supported input of `request`; raise InvalidInput naming the first bad one.
    Whatever a client sends ends here as a ParsedRequest or an InvalidInput: a value that slips past
    the checks above and makes Python itself fail (a type, an overflow) is still the client's data."""
    try:
        return _parse(request, pb)
    except InvalidInput:
        raise
    except (TypeError, ValueError, OverflowError, RecursionError, UnicodeError) as exc:
        raise InvalidInput(f"the request's inputs could not be read: {type(exc).__name__}: "
                           f"{short(str(exc), 200, plain=True)}") from None


def _parse(request, pb) -> ParsedRequest:
    prompt, token_mode = _prompt(request, pb)
    fields: dict[str, Any] = {}
    extra = _apply_json(fields, _request_parameters(request), "parameters", strict=False)
    raw = _scalar(request, pb, "sampling_parameters", str)
    extra.update(_apply_json(fields, json_object(raw, "sampling_parameters"), "sampling_parameters", strict=True))
    for name, p in _SCALAR_PARAMS.items():
        raw = _scalar(request, pb, name, p.kind)
        if raw is not None:
            value = p.read("triton", raw)  # None: the default (TensorRT-LLM's top_p 0 disables it)
            fields[p.name] = p.default if value is None else value
    stop_sequences = _trtllm_extras(request, pb, fields)
    layout = codec_layout(request)
    present = lambda name: pb.get_input_tensor_by_name(request, name) is not None  # noqa: E731
    trtllm = layout == "trtllm" or any(present(n) for n in _TRTLLM_ONLY)
    if (trtllm or token_mode) and not any(present(n) for n in _SAMPLING_INPUTS) and "temperature" not in fields:
        fields["temperature"] = 0.0  # TensorRT-LLM and FasterTransformer are greedy unless asked to sample
    stop = [s for name in _STOP_INPUTS for s in _strings(request, pb, name) or []]
    if stop:
        fields["stop"] = list(fields.get("stop", [])) + stop
    outputs = OutputOptions(
        output_ids=token_mode,
        logprobs=_flag(request, pb, "return_logprobs", extra),
        trtllm_log_probs=_flag(request, pb, "return_log_probs", extra) or _flag(request, pb, "is_return_log_probs", {}),
        cumulative_logprob=_flag(request, pb, "return_cumulative_logprob", extra),
        finish_reason=_flag(request, pb, "return_finish_reason", extra),
        num_input_tokens=_flag(request, pb, "return_num_input_tokens", extra),
        num_output_tokens=_flag(request, pb, "return_num_output_tokens", extra),
        perf_metrics=_flag(request, pb, "return_perf_metrics", extra),
    )
    if (outputs.logprobs or outputs.trtllm_log_probs or outputs.cumulative_logprob) and fields.get("logprobs") is None:
        fields["logprobs"] = 0  # the chosen token's logprob is computed only when asked for
    params = SamplingParams(**fields)
    try:
        params.validate()
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    exclude = _flag(request, pb, "exclude_input_in_output", extra, default=trtllm or token_mode)
    stream = _flag(request, pb, "stream", extra) or _flag(request, pb, "streaming", {})
    return ParsedRequest(prompt=prompt, params=params, stream=stream, echo_prompt=not exclude, outputs=outputs,
                         stop_sequences=stop_sequences)


def codec_layout(request) -> str:
    """The layout a forwarding model declared for this request ("" when none)."""
    value = request_parameter(request, LAYOUT_PARAMETER)
    return value if isinstance(value, str) else ""


def _trtllm_extras(request, pb, fields: dict) -> list[list[int]]:
    """beam_width, word lists, end_id and the refused inputs; returns the multi-token stop words."""
    refuse_unsupported(request, pb)
    beam = _scalar(request, pb, "beam_width", int)
    if beam is not None and beam != 1:
        raise InvalidInput(f"input 'beam_width' must be 1 (beam search is not supported), got {beam}")
    if _strings(request, pb, "bad_words"):
        raise InvalidInput("input 'bad_words' is not supported (send it empty)")
    end_id = _scalar(request, pb, "end_id", int)
    if end_id is not None:
        if end_id < 0:
            raise InvalidInput(f"input 'end_id' must be a token id (>= 0), got {end_id}")
        fields["stop_token_ids"] = list(fields.get("stop_token_ids", [])) + [end_id]
    if word_lists(_array(request, pb, "bad_words_list"), "bad_words_list"):
        raise InvalidInput("input 'bad_words_list' is not supported (send it without words, -1 padded)")
    stop_words = word_lists(_array(request, pb, "stop_words_list"), "stop_words_list")
    singles = [w[0] for w in stop_words if len(w) == 1]
    if singles:
        fields["stop_token_ids"] = list(fields.get("stop_token_ids", [])) + singles
    return [w for w in stop_words if len(w) > 1]


def _array(request, pb, name: str) -> Optional[np.ndarray]:
    tensor = pb.get_input_tensor_by_name(request, name)
    return None if tensor is None else np.asarray(tensor.as_numpy())


# -- writing outputs --------------------------------------------------------------------------


def _bytes_tensor(pb, name: str, values: list[str], batch_dim: bool):
    arr = np.array([v.encode("utf-8") for v in values], dtype=np.object_)
    return pb.Tensor(name, arr.reshape(1, -1) if batch_dim else arr)


def _tensor(pb, name: str, values, dtype, batch_dim: bool):
    arr = np.asarray(values, dtype=dtype).reshape(-1)
    return pb.Tensor(name, arr.reshape(1, -1) if batch_dim else arr)


def logprobs_json(logprobs: list[TokenLogprob], decode: Optional[Callable[[int], str]] = None) -> str:
    """vllm_backend layout: one {"<token_id>": {"logprob", "rank", "decoded_token"}} per token."""
    entries = []
    for lp in logprobs:
        top = {tid: (rank + 1, value) for rank, (tid, value) in enumerate(lp.top)}
        entry = {}
        for tid, value in [(lp.token_id, lp.logprob)] + [(t, v) for t, v in lp.top if t != lp.token_id]:
            entry[str(tid)] = {"logprob": value, "rank": top.get(tid, (None,))[0],
                               "decoded_token": decode(tid) if decode else None}
        entries.append(entry)
    return json.dumps(entries)


def make_response(out: RequestOutput, req: ParsedRequest, pb, *, batch_dim: bool = False,
                  decode: Optional[Callable[[int], str]] = None, perf: Optional[PerfMetrics] = None):
    """The response for one engine output: the delta when streaming, else the whole output."""
    echo_ids: list[int] = []
    if req.stream:
        text, ids, logprobs = out.delta_text, out.delta_token_ids, out.delta_logprobs
    else:
        text, ids, logprobs = out.text, out.token_ids, out.logprobs
        if req.echo_prompt and isinstance(req.prompt, str):
            text = req.prompt + text
        elif req.echo_prompt:
            echo_ids = list(req.prompt)
    want = req.outputs
    tensors = [_bytes_tensor(pb, "text_output", [text], batch_dim)]
    if want.output_ids:
        tensors.append(_tensor(pb, "output_ids", echo_ids + list(ids), np.int32, batch_dim))
        tensors.append(_tensor(pb, "sequence_length", [len(echo_ids) + len(ids)], np.int32, batch_dim))
    if want.finish_reason:
        tensors.append(_bytes_tensor(pb, "finish_reason", [out.finish_reason or ""], batch_dim))
    if want.num_input_tokens:
        tensors.append(_tensor(pb, "num_input_tokens", [out.num_prompt_tokens], np.uint32, batch_dim))
    if want.num_output_tokens:
        tensors.append(_tensor(pb, "num_output_tokens", [len(ids)], np.uint32, batch_dim))
    cumulative = out.cumulative_logprob if out.cumulative_logprob is not None else 0.0
    if want.cumulative_logprob:
        tensors.append(_tensor(pb, "cumulative_logprob", [cumulative], np.float32, batch_dim))
    if want.logprobs:
        tensors.append(_bytes_tensor(pb, "logprobs", [logprobs_json(logprobs or [], decode)], batch_dim))
    if want.trtllm_log_probs:
        tensors.append(_tensor(pb, "cum_log_probs", [cumulative], np.float32, batch_dim))
        tensors.append(_tensor(pb, "output_log_probs", [lp.logprob for lp in logprobs or []], np.float32,
                               batch_dim))
    if want.perf_metrics and perf is not None:
        tensors += [_tensor(pb, name, [value], dtype, batch_dim) for name, (value, dtype) in perf.values().items()]
    return pb.InferenceResponse(output_tensors=tensors)


def wants_tagged_errors(request) -> bool:
    try:
        return bool(_request_parameters(request).get(TAG_ERRORS)) if hasattr(request, "parameters") else False
    except InvalidInput:
        return False
