"""The tensors each forwarding model declares, per client layout.

- "vllm" (`llm_bls`): the engine model's own inputs and outputs, no batch dimension.
- "trtllm" (`tensorrt_llm`, `llm_tokens`, `tensorrt_llm_bls`): TensorRT-LLM's names with a
  batch dimension; output_ids [B, 1, L] and sequence_length [B, 1] (beam width 1).
- "fastertransformer" (`fastertransformer`): FasterTransformer's types (UINT32 ids, lengths and
  counts), output_ids [B, 1, L] holding the prompt followed by the generated ids, sequence_length
  [B, 1] their total, as that backend returned them.
Each row of a batch is its own engine request; the forwarding model casts a row to the engine
model's types (values.py bounds them) and pads the rows' outputs back into one batch.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from tritongen.params import PARAMS
from tritongen.triton.codec import INPUTS, OUTPUTS, TensorSpec
from tritongen.triton.trtllm import PERF_OUTPUT_NAMES

LAYOUTS = ("vllm", "trtllm", "fastertransformer")
MAX_BATCH_SIZE = 64

BEAM_OUTPUTS = frozenset({"output_ids", "output_log_probs"})
"""Outputs with a beam axis in batched layouts: each row's [L] becomes [1, L] (beam width 1)."""

NUMPY_TYPES = {"TYPE_BOOL": np.bool_, "TYPE_INT32": np.int32, "TYPE_INT64": np.int64, "TYPE_UINT32": np.uint32,
               "TYPE_UINT64": np.uint64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_STRING": np.object_}
ENGINE_INPUT_TYPES = {s.name: NUMPY_TYPES[s.data_type] for s in INPUTS}
ENGINE_OUTPUT_NAMES = frozenset(s.name for s in OUTPUTS)

_PERF = tuple(s for s in OUTPUTS if s.name in PERF_OUTPUT_NAMES)
_CLIENT_INPUTS = INPUTS  # abort_request_id too: the engine model refuses it without its token

TRTLLM_TOKEN_OUTPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("output_ids", "TYPE_INT32", (-1, -1), "[B, 1, L] generated ids, padded with end_id (else 0)"),
    TensorSpec("sequence_length", "TYPE_INT32", (-1,), "[B, 1] valid ids per row"),
    TensorSpec("text_output", "TYPE_STRING", (-1,), "the engine's text of those ids (UTF-8 safe when streamed)"),
    TensorSpec("finish_reason", "TYPE_STRING", (-1,)),
    TensorSpec("cum_log_probs", "TYPE_FP32", (-1,)),
    TensorSpec("output_log_probs", "TYPE_FP32", (-1, -1)),
) + _PERF

TRTLLM_TEXT_OUTPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_output", "TYPE_STRING", (-1,)),
    TensorSpec("finish_reason", "TYPE_STRING", (-1,)),
    TensorSpec("cum_log_probs", "TYPE_FP32", (-1,)),
    TensorSpec("output_log_probs", "TYPE_FP32", (-1, -1)),
) + _PERF

_BY_NAME = {s.name: s for s in INPUTS}


def _ft_field(p) -> TensorSpec:
    """A SamplingParams field's input in FasterTransformer's layout (params.Param.ft)."""
    spec = _BY_NAME[p.ft.name]
    return replace(spec, data_type=p.ft.data_type or spec.data_type, dims=p.ft.dims or spec.dims)


_FT_OTHER = ("len_penalty", "beam_width", "end_id", "pad_id", "stop_words_list", "bad_words_list",
             "is_return_log_probs", "return_log_probs", "exclude_input_in_output", "return_perf_metrics")
_FT_UINT32 = frozenset({"input_ids", "input_lengths", "beam_width", "end_id", "pad_id"})


def _ft_other(name: str) -> TensorSpec:
    spec = _BY_NAME[name]
    return replace(spec, data_type="TYPE_UINT32") if name in _FT_UINT32 else spec


FT_INPUTS: tuple[TensorSpec, ...] = (
    tuple(_ft_other(n) for n in ("input_ids", "input_lengths"))
    + tuple(_ft_field(p) for p in PARAMS if p.ft)
    + tuple(_ft_other(n) for n in _FT_OTHER))
FT_OUTPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("output_ids", "TYPE_UINT32", (-1, -1), "[B, 1, L]: prompt then generated ids, padded"),
    TensorSpec("sequence_length", "TYPE_UINT32", (-1,), "[B, 1]: prompt + generated ids"),
    TensorSpec("cum_log_probs", "TYPE_FP32", (-1,)),
    TensorSpec("output_log_probs", "TYPE_FP32", (-1, -1)),
) + _PERF


def inputs_for(layout: str) -> tuple[TensorSpec, ...]:
    return FT_INPUTS if layout == "fastertransformer" else _CLIENT_INPUTS


def engine_row(name: str, array: np.ndarray):
    """One batch row of a client input, cast to the engine model's type; None when the value
    does not fit that type (the caller refuses it naming the input)."""
    target = ENGINE_INPUT_TYPES.get(name)
    if target is None or array.dtype == target or target is np.object_:
        return array
    if np.issubdtype(target, np.integer) and array.dtype.kind in "iu":
        info = np.iinfo(target)
        if array.size and (array.min() < info.min or array.max() > info.max):
            return None
    return array.astype(target)


def stack_rows(name: str, rows: list[np.ndarray], dtype, pad_value=0) -> np.ndarray:
    """Rows of one output (each [n_i], from the engine model) -> [B, max n] padded, with the beam
    axis for BEAM_OUTPUTS; cast to the declared `dtype`."""
    width = max((r.size for r in rows), default=0)
    if dtype is np.object_:
        out = np.full((len(rows), width), b"", dtype=np.object_)
    else:
        out = np.full((len(rows), width), pad_value, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, :row.size] = row.reshape(-1)
    return out[:, np.newaxis, :] if name in BEAM_OUTPUTS else out


def empty_output(spec: TensorSpec, batch: int) -> np.ndarray:
    """A declared output no row produced (the ensemble's step must send every mapped output):
    [B, 1, 0] for BEAM_OUTPUTS, else [B, 1] of zeros (empty strings)."""
    dtype = NUMPY_TYPES[spec.data_type]
    shape = (batch, 1, 0) if spec.name in BEAM_OUTPUTS else (batch, 1)
    return np.full(shape, b"" if dtype is np.object_ else 0, dtype=dtype)
