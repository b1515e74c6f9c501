"""The pipelined engine loop (the default on CUDA), with and without asynchronous scheduling, with
the real runner and tiny model on CPU, forced on: the same outputs as the sequential loop, also
with stop strings, seeds and logprobs."""
import pytest

from tritongen import LLM, SamplingParams

PROMPTS = ["Hello there", [5, 6, 7, 8, 9] * 7, "The quick brown fox jumps", [300] * 3]


def _params() -> list[SamplingParams]:
    return [SamplingParams(max_tokens=12, temperature=0, logprobs=2),
            SamplingParams(max_tokens=9, temperature=0.8, seed=7),
            SamplingParams(max_tokens=14, temperature=0, prompt_logprobs=1),
            SamplingParams(max_tokens=6, temperature=1.0, top_k=20, seed=3)]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_pipelined_llm_equals_sequential(async_scheduling: bool) -> None:
    llm = LLM("dummy:tiny-llama", num_blocks=20, block_size=4, max_num_batched_tokens=16, max_num_seqs=3,
              enable_prefix_caching=False)  # cache hits would change the arithmetic between runs
    assert not llm.engine.pipelined  # CPU launches are synchronous: the sequential loop by default
    expected = llm.generate(PROMPTS, _params())
    # A stop string the greedy run reaches mid-way: found one step late by the pipelined loop.
    stop = expected[0].text[len(expected[0].text) // 2:][:2]
    llm.engine.pipelined, llm.engine.async_scheduling = True, async_scheduling
    launched = []
    launch = llm.engine.runner.launch
    llm.engine.runner.launch = lambda sched: launched.append(sched.input_from_previous) or launch(sched)
    got = llm.generate(PROMPTS, _params())
    stopped_seq = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=12, temperature=0, stop=[stop]))[0]
    llm.engine.pipelined = llm.engine.async_scheduling = False
    assert any(launched) == async_scheduling  # steps fed on the device really ran
    stopped_ref = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=12, temperature=0, stop=[stop]))[0]
    for e, g in zip(expected, got):
        assert (g.token_ids, g.text, g.finish_reason) == (e.token_ids, e.text, e.finish_reason)
        # Asynchronous scheduling admits requests a step earlier, so batches differ and float32
        # sums with them (by ~1e-7); the pipelined loop alone runs the very same batches.
        tol = 1e-5 if async_scheduling else 0
        assert [lp.logprob for lp in g.logprobs or []] == pytest.approx([lp.logprob for lp in e.logprobs or []], abs=tol)
        prompt_lps = [[lp and lp.logprob for lp in o.prompt_logprobs or []] for o in (g, e)]
        assert prompt_lps[0] == pytest.approx(prompt_lps[1], abs=tol)
    assert stopped_seq.finish_reason == stopped_ref.finish_reason == "stop"
    assert (stopped_seq.text, stopped_seq.token_ids) == (stopped_ref.text, stopped_ref.token_ids)
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
