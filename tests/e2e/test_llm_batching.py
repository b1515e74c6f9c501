"""LLM.generate on a tiny random Llama (real tokenizer): batching invariance in all its forms."""
import random

import pytest

from tritongen import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def mixed_prompts(n: int, seed: int = 0, lo: int = 2, hi: int = 60) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, 49000) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


@pytest.fixture(scope="module")
def prompts():
    return mixed_prompts(64)


@pytest.fixture(scope="module")
def alone(prompts):
    llm = LLM("dummy:tiny-llama", dtype="float32", device="cpu", enable_prefix_caching=False)
    return [llm.generate([p], GREEDY)[0].token_ids for p in prompts]


def test_64_requests_together_equal_each_alone(prompts, alone):
    llm = LLM("dummy:tiny-llama", dtype="float32", device="cpu")
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == alone
    st = llm.stats()
    assert st["kv_blocks_free"] == st["kv_blocks_total"] and st["num_running"] == 0


def test_with_preemption(prompts, alone):
    llm = LLM("dummy:tiny-llama", dtype="float32", device="cpu", num_blocks=24, block_size=8)
    outs = llm.generate(prompts, GREEDY)
    assert llm.stats()["num_preemptions"] > 0
    assert [o.token_ids for o in outs] == alone


def test_with_chunked_prefill(prompts, alone):
    llm = LLM("dummy:tiny-llama", dtype="float32", device="cpu", max_num_batched_tokens=24)
    assert max(len(p) for p in prompts) > 24
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == alone


def test_with_prefix_cache_hits(prompts, alone):
    llm = LLM("dummy:tiny-llama", dtype="float32", device="cpu", block_size=4)
    shared = [p for p in prompts if len(p) > 20][:8]
    first = llm.generate(shared, GREEDY)
    again = llm.generate(shared + [s[:-1] + [77] for s in shared], GREEDY)
    assert llm.stats()["prefix_cache_hit_rate"] > 0
    assert sum(o.num_cached_tokens for o in again) > 0
    assert [o.token_ids for o in again[: len(shared)]] == [o.token_ids for o in first]
    expected = [o.token_ids for o in LLM("dummy:tiny-llama", dtype="float32", device="cpu",
                                         enable_prefix_caching=False).generate(
        [s[:-1] + [77] for s in shared], GREEDY)]
    assert [o.token_ids for o in again[len(shared):]] == expected


def test_seeded_sampling_is_reproducible_across_batches():
    llm = LLM("dummy:tiny-llama", dtype="float32", device="cpu")
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=12, ignore_eos=True)
    target = [5, 6, 7, 8]
    alone = llm.generate([target], p)[0].token_ids
    others = mixed_prompts(10, seed=9)
    batch = llm.generate(others + [target], [SamplingParams(temperature=1.0, max_tokens=12)] * 10 + [p])
    assert batch[-1].token_ids == alone
    other_seed = llm.generate([target], SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=99,
                                                       max_tokens=12, ignore_eos=True))[0].token_ids
    assert other_seed != alone


def test_abort_returns_every_block():
    import asyncio

    from tritongen import AsyncLLM

    llm = AsyncLLM("dummy:tiny-llama", dtype="float32", device="cpu")

    async def run():
        gen = llm.generate([1, 2, 3, 4] * 10, SamplingParams(max_tokens=500, ignore_eos=True), "victim")
        first = await gen.__anext__()
        assert not first.finished
        assert llm.stats()["num_running"] + llm.stats()["num_waiting"] >= 0
        await llm.abort("victim")
        st = llm.stats()
        assert st["kv_blocks_free"] == st["kv_blocks_total"]
        rest = [o async for o in gen]
        assert rest and rest[-1].finish_reason == "abort"

    try:
        asyncio.run(run())
    finally:
        llm.shutdown()
