"""Checks every model-family test runs (test_families.py, test_dense_families.py, test_moe.py):
HF configs of the tiny presets, the whole-engine greedy/logprob parity against a reference, and a
greedy chat through the real OpenAI server."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Callable

import torch

from tritongen import LLM, SamplingParams
from tritongen.models.presets import PRESETS

MAX_TOKENS = 10
# Lengths 1..41: a single token, within one block (block_size 4), across blocks, and 25/41 tokens
# that the 16-token budget splits into two and three prefill chunks.
PROMPT_LENGTHS = (1, 3, 9, 25, 41)
# float32 rounds at 6e-8; two layers of width 64-128, summed in another order than HF's (paged
# attention, chunks), leave the last hidden state off by ~1e-6 of its size, and a logprob scales
# that by the spread of the logits (a few units): ~1e-5 at worst. 1e-4 leaves room for thread-count
# effects on a loaded machine; a real bug (a transposed weight, a wrong position) moves logprobs
# by 1e-2 or more, and the greedy tokens must match exactly anyway.
LOGPROB_ATOL = 1e-4
Greedy = Callable[[list[int]], tuple[list[int], list[float]]]


def hf_config(preset: str):
    """The transformers config of a dummy preset (its config.json without the keys AutoConfig refuses)."""
    import transformers

    d = copy.deepcopy(PRESETS[preset])
    d.pop("architectures")
    d.pop("torch_dtype", None)
    return transformers.AutoConfig.for_model(d.pop("model_type"), **d)


def random_prompts(vocab: int, seed: int, lengths=PROMPT_LENGTHS) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def check_engine(path: Path, tokenizer: str, reference: Greedy, vocab: int, architecture: str) -> None:
    """The engine on the checkpoint in `path` (block size 4, a 16-token budget that chunks the long
    prompts, prefix caching with a second round sharing prefixes, all batched) gives `reference`'s
    greedy tokens and logprobs within LOGPROB_ATOL."""
    llm = LLM(str(path), tokenizer=tokenizer, dtype="float32", device="cpu", block_size=4,
              max_num_batched_tokens=16, enable_prefix_caching=True)
    assert llm.engine.runner.arch.architecture == architecture
    first = random_prompts(vocab, seed=2)
    second = [first[3][:20] + [5, 6, 7], first[4][:33] + [8], *random_prompts(vocab, seed=3, lengths=(2, 14))]
    for batch in (first, second):
        check_batch(llm, batch, reference, architecture)
    assert llm.stats()["prefix_cache_hit_rate"] > 0


def check_batch(llm, batch: list[list[int]], reference: Greedy, architecture: str) -> None:
    """One batched greedy generate of `batch`: every prompt's tokens equal `reference`'s and its
    logprobs are within LOGPROB_ATOL."""
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    for prompt, out in zip(batch, llm.generate(batch, params)):
        ids, lps = reference(prompt)
        assert out.token_ids == ids, (architecture, len(prompt))
        ours = torch.tensor([lp.logprob for lp in out.logprobs])
        torch.testing.assert_close(ours, torch.tensor(lps), atol=LOGPROB_ATOL, rtol=0)


def check_openai_chat(preset: str, tokenizer: str) -> None:
    """`dummy:<preset>` behind the real OpenAI server (uvicorn on 127.0.0.1): a greedy chat request
    (the tokenizer's chat template) answers what the engine generates for the templated ids."""
    import asyncio

    import openai
    from oai_helpers import ServerThread

    from tritongen import AsyncLLM
    from tritongen.openai.server import build_app

    engine = AsyncLLM(f"dummy:{preset}", tokenizer=tokenizer, dtype="float32", device="cpu", kv_cache_memory_gb=0.02)
    srv = ServerThread(build_app(engine, served_model_name=preset))
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="-", max_retries=0, timeout=60)
        chat = [{"role": "user", "content": "What is the capital of France?"}]
        r = client.chat.completions.create(model=preset, messages=chat, max_tokens=6, temperature=0,
                                           extra_body={"ignore_eos": True})
        ids = list(engine.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)["input_ids"])

        async def direct():
            params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
            return [o async for o in engine.generate(ids, params, request_id="direct")][-1]

        want = asyncio.run(direct())
        assert r.choices[0].message.content == want.text and r.usage.completion_tokens == 6
        assert r.usage.prompt_tokens == len(ids)
    finally:
        srv.stop()
        engine.shutdown()
