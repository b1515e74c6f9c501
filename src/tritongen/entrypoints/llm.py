"""Offline entry point: LLM(model=...).generate(prompts, params)."""
from __future__ import annotations

import itertools
from typing import Optional, Sequence as Seq, Union

from tritongen.config import EngineConfig
from tritongen.core.engine import EngineCore, EngineLimits
from tritongen.types import RequestOutput, SamplingParams

PromptInput = Union[str, list[int]]


def _tokenizer_path(config: EngineConfig, model_path: str) -> str:
    from tritongen.preset_tokenizers import tokenizer_dir

    return tokenizer_dir(config.model.tokenizer, model_path)  # a dummy preset: one of its vocabulary


def create_engine(config: EngineConfig) -> EngineCore:
    """Load model, tokenizer and KV cache; return a ready EngineCore."""
    from tritongen.fetch import resolve_model
    from tritongen.preflight import check_memory
    from tritongen.runner.model_runner import ModelRunner
    from tritongen.tokenizer import FastDecoder, load_tokenizer

    model_path = resolve_model(config.model.model)
    check_memory(config, model_path)  # refuse a model that cannot fit before any weight is allocated
    if config.parallel.tensor_parallel_size > 1:
        from tritongen.runner.tp_runner import TensorParallelRunner

        runner = TensorParallelRunner(config, model_path)
    else:
        runner = ModelRunner(config.model, config.cache, config.scheduler, model_path)
    tokenizer = load_tokenizer(_tokenizer_path(config, model_path))
    arch = runner.arch
    eos = set(arch.eos_token_ids)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        eos.add(tokenizer.eos_token_id)
    if (arch.position_encoding == "learned" and config.model.max_model_len
            and config.model.max_model_len > arch.max_position_embeddings):
        # A learned position table has no row past its end: a longer sequence would index out of
        # it inside a step (on CUDA a device-side assert that ends the process).
        raise ValueError(f"max_model_len {config.model.max_model_len} exceeds the model's "
                         f"{arch.max_position_embeddings} learned positions")
    limits = EngineLimits(
        max_model_len=config.model.max_model_len or arch.max_position_embeddings,
        vocab_size=arch.vocab_size,
        eos_token_ids=tuple(sorted(eos)),
    )
    return EngineCore(runner, tokenizer, limits, config.scheduler, config.cache.enable_prefix_caching,
                      decoder=FastDecoder(tokenizer))


def normalize_prompts(prompts: Union[PromptInput, Seq[PromptInput]]) -> list[PromptInput]:
    """A str, a token-id list, or a list of either -> a list of prompts."""
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]  # one prompt given as token ids
    return prompts


class LLM:
    """Synchronous engine for offline batches. Keyword options are those of EngineConfig's parts
    (dtype, device, max_model_len, seed, block_size, num_blocks, kv_cache_memory_gb,
    enable_prefix_caching, max_num_seqs, max_num_batched_tokens, tensor_parallel_size, ...)."""

    def __init__(self, model: Optional[str] = None, **kwargs) -> None:
        self.config = EngineConfig.from_kwargs(model=model, **kwargs)
        self.engine = create_engine(self.config)
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Union[PromptInput, Seq[PromptInput]],
        sampling_params: Union[SamplingParams, Seq[SamplingParams], None] = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in input order."""
        prompts = normalize_prompts(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"got {len(prompts)} prompts but {len(params)} sampling params")
        ids = [f"llm-{next(self._ids)}" for _ in prompts]
        try:
            for rid, prompt, p in zip(ids, prompts, params):
                self.engine.add_request(rid, prompt, p)
        except Exception:
            for rid in ids:
                self.engine.abort(rid)
            self.engine.step()  # drain the abort outputs
            raise
        final: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[rid] for rid in ids]

    def chat(self, messages: list[dict], sampling_params: Optional[SamplingParams] = None) -> RequestOutput:
        """One conversation through the tokenizer's chat template."""
        from tritongen.tokenizer import chat_prompt_ids

        return self.generate([chat_prompt_ids(self.tokenizer, messages)], sampling_params)[0]

    def stats(self) -> dict:
        return self.engine.stats()

    def shutdown(self) -> None:
        """Release the engine's processes (tensor-parallel workers); also runs at exit."""
        self.engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
