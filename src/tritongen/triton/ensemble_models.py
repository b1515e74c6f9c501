"""The `--layout ensemble` models, named and shaped like TensorRT-LLM's:

    ensemble: text_input, max_tokens, stop_words, temperature, ... -> text_output, cum_log_probs, ...
      preprocessing   QUERY -> INPUT_ID, REQUEST_INPUT_LEN          (tokenize)
      tensorrt_llm    input_ids, input_lengths, ... -> output_ids, sequence_length, text_output
                      (non-decoupled, batched; forwards each row to the engine model, bls_model.py)
      postprocessing  TOKENS_BATCH, SEQUENCE_LENGTH [, TEXT] -> OUTPUT (detokenize)
    <name>_tokens:    tensorrt_llm's tensors, decoupled: `streaming` / `stream` chooses
    tensorrt_llm_bls: text_input, max_tokens, stream, ... -> text_output; decoupled

`ensemble` is not decoupled (its token step is not), so it takes unary gRPC / HTTP infer and
batches up to max_batch_size, as TensorRT-LLM's ensemble built without decoupled mode; streaming
clients use `<name>_tokens` or `tensorrt_llm_bls`. All have max_batch_size > 0: clients send a
leading batch dimension. The token step also carries the engine's incrementally detokenized text,
which postprocessing passes through instead of decoding the ids again.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np

from tritongen.params import PARAMS
from tritongen.triton import layouts
from tritongen.triton.codec import INPUTS, TensorSpec
from tritongen.triton.pbtxt import model_config, tensors, version_policy, write_forwarder, write_model
from tritongen.triton.trtllm import PERF_OUTPUT_NAMES

MAX_BATCH_SIZE = layouts.MAX_BATCH_SIZE
TOKEN_STEP = "tensorrt_llm"
BLS = "tensorrt_llm_bls"

_ENSEMBLE_INPUTS = (("text_input",) + tuple(p.ensemble for p in PARAMS if p.ensemble)
                    + ("bad_words", "end_id", "pad_id", "length_penalty", "return_log_probs", "return_context_logits",
                       "return_generation_logits", "return_perf_metrics", "beam_width", "stream",
                       "exclude_input_in_output", "num_return_sequences", "lora_task_id", "lora_weights",
                       "lora_config", "prompt_embedding_table", "prompt_vocab_size"))
"""TensorRT-LLM's ensemble inputs: the prompt, the SamplingParams fields by their ensemble names
(params.PARAMS), then its other controls."""
_STEP_OUTPUTS = ("cum_log_probs", "output_log_probs") + PERF_OUTPUT_NAMES
"""Token-step outputs the ensemble returns as they are."""
_PRE_INPUTS = (TensorSpec("QUERY", "TYPE_STRING", (1,)),)
_PRE_OUTPUTS = (TensorSpec("INPUT_ID", "TYPE_INT32", (-1,)), TensorSpec("REQUEST_INPUT_LEN", "TYPE_INT32", (1,)))
_POST_INPUTS = (TensorSpec("TOKENS_BATCH", "TYPE_INT32", (-1, -1)), TensorSpec("SEQUENCE_LENGTH", "TYPE_INT32", (-1,)),
                TensorSpec("TEXT", "TYPE_STRING", (-1,), "optional: token-only callers send the ids alone"))
_POST_OUTPUTS = (TensorSpec("OUTPUT", "TYPE_STRING", (-1,)),)


def model_names(name: str) -> list[str]:
    return ["preprocessing", TOKEN_STEP, f"{name}_tokens", "postprocessing", "ensemble", BLS]


def _maps(kind: str, pairs: dict[str, str]) -> str:
    return "".join(f'      {kind} {{ key: "{k}" value: "{v}" }}\n' for k, v in pairs.items())


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    return (f'    {{\n      model_name: "{model}"\n      model_version: -1\n'
            + _maps("input_map", inputs) + _maps("output_map", outputs) + "    }")


def ensemble_config(policy: Optional[str] = None) -> str:
    by_name = {s.name: s for s in INPUTS}
    outputs = {s.name: s for s in layouts.TRTLLM_TOKEN_OUTPUTS}
    text = f'name: "ensemble"\nplatform: "ensemble"\nmax_batch_size: {MAX_BATCH_SIZE}\n' + version_policy(policy)
    text += tensors("input", [by_name[n] for n in _ENSEMBLE_INPUTS], set(_ENSEMBLE_INPUTS[1:]))
    text += tensors("output", [TensorSpec("text_output", "TYPE_STRING", (-1,))] + [outputs[n] for n in _STEP_OUTPUTS],
                    False)
    token_inputs = {"input_ids": "_INPUT_ID", "input_lengths": "_REQUEST_INPUT_LEN"}
    token_inputs.update({n: n for n in _ENSEMBLE_INPUTS[1:]})
    token_outputs = {"output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH", "text_output": "_TEXT"}
    token_outputs.update({n: n for n in _STEP_OUTPUTS})
    steps = [
        _step("preprocessing", {"QUERY": "text_input"},
              {"INPUT_ID": "_INPUT_ID", "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN"}),
        _step(TOKEN_STEP, token_inputs, token_outputs),
        _step("postprocessing", {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH",
                                 "TEXT": "_TEXT"}, {"OUTPUT": "text_output"}),
    ]
    return text + "ensemble_scheduling {\n  step [\n" + ",\n".join(steps) + "\n  ]\n}\n"


def write_ensemble(root: Path, name: str, params: dict[str, str], version: int, policy: Optional[str] = None) -> None:
    tokenizer = {k: v for k, v in params.items() if k in ("model", "tokenizer")}
    write_model(root, "preprocessing", model_config(
        "preprocessing", decoupled=False, instance_kind="KIND_CPU", parameters=tokenizer, inputs=_PRE_INPUTS,
        outputs=_PRE_OUTPUTS, max_batch_size=MAX_BATCH_SIZE, optional_inputs=False, policy=policy),
        "tritongen.triton.ensemble_models", version, "Preprocessing")
    write_forwarder(root, TOKEN_STEP, name, "trtllm", decoupled=False, version=version, policy=policy,
                    all_outputs=True)  # an ensemble step must send every output the ensemble maps
    write_forwarder(root, f"{name}_tokens", name, "trtllm", decoupled=True, version=version, policy=policy)
    write_forwarder(root, BLS, name, "trtllm", decoupled=True, version=version, policy=policy, text=True)
    write_model(root, "postprocessing", model_config(
        "postprocessing", decoupled=False, instance_kind="KIND_CPU", parameters=tokenizer, inputs=_POST_INPUTS,
        outputs=_POST_OUTPUTS, max_batch_size=MAX_BATCH_SIZE, optional_inputs={"TEXT"}, policy=policy),
        "tritongen.triton.ensemble_models", version, "Postprocessing")
    write_model(root, "ensemble", ensemble_config(policy), None, version)


class _RustTokenizer:
    """tokenizer.json through the `tokenizers` library: loads in a fraction of a second, where
    importing transformers takes seconds in each of the two processes."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def _load_tokenizer(args: dict):
    from tritongen.preset_tokenizers import tokenizer_dir

    params = json.loads(args["model_config"]).get("parameters", {})
    path = tokenizer_dir(params.get("tokenizer", {}).get("string_value") or None,
                         params.get("model", {}).get("string_value") or None)  # the engine's detokenizer's
    config = Path(path) / "tokenizer_config.json"
    # Llama-style configs may add BOS in Python code (add_bos_token); only transformers knows that.
    if (Path(path) / "tokenizer.json").is_file() and "add_bos_token" not in (config.read_text() if config.is_file() else ""):
        return _RustTokenizer(Path(path) / "tokenizer.json")
    from tritongen.tokenizer import load_tokenizer

    return load_tokenizer(path)


class Preprocessing:
    """QUERY [B, 1] -> INPUT_ID [B, L] (right-padded with 0), REQUEST_INPUT_LEN [B, 1]."""

    def initialize(self, args: dict) -> None:
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        self.tokenizer = _load_tokenizer(args)

    def execute(self, requests: list) -> list:
        pb = self.pb
        responses = []
        for request in requests:
            queries = pb.get_input_tensor_by_name(request, "QUERY").as_numpy().reshape(-1)
            try:
                ids = [self.tokenizer.encode(q.decode("utf-8")) for q in queries]
            except UnicodeDecodeError as exc:
                responses.append(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(
                    f"input 'text_input' is not valid UTF-8: {exc}", pb.TritonError.INVALID_ARG)))
                continue
            width = max(1, max(len(row) for row in ids))
            padded = np.zeros((len(ids), width), dtype=np.int32)
            for i, row in enumerate(ids):
                padded[i, :len(row)] = row
            lengths = np.array([[len(row)] for row in ids], dtype=np.int32)
            responses.append(pb.InferenceResponse(output_tensors=[
                pb.Tensor("INPUT_ID", padded), pb.Tensor("REQUEST_INPUT_LEN", lengths)]))
        return responses


class Postprocessing:
    """TOKENS_BATCH [B, 1, L], SEQUENCE_LENGTH [B, 1] -> OUTPUT [B, 1]; TEXT, when given, is passed
    through (the engine's incremental detokenization, UTF-8 safe while streaming)."""

    def initialize(self, args: dict) -> None:
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        self.tokenizer = _load_tokenizer(args)

    def execute(self, requests: list) -> list:
        pb = self.pb
        responses = []
        for request in requests:
            text = pb.get_input_tensor_by_name(request, "TEXT")
            if text is not None:
                out = text.as_numpy().reshape(-1, 1)
            else:
                tokens = pb.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
                lengths = pb.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy().reshape(-1)
                tokens = tokens.reshape(len(lengths), -1)
                out = np.array([[self.tokenizer.decode(row[:n].tolist(), skip_special_tokens=True).encode("utf-8")]
                                for row, n in zip(tokens, lengths)], dtype=np.object_)
            responses.append(pb.InferenceResponse(output_tensors=[pb.Tensor("OUTPUT", out)]))
        return responses
