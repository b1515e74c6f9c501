"""AsyncLLM with the engine loop in a child process: outputs equal the in-process engine's,
deltas rebuild the cumulative fields, and nothing outlives shutdown. (tests/e2e/test_async_llm.py
also runs all its stream tests in this mode; tests/e2e/test_engine_restart.py kills the child.)"""
import asyncio
import pickle

import pytest

from tritongen import AsyncLLM, SamplingParams
from tritongen.core.engine import EngineCore
from tritongen.entrypoints.async_engine import wants_engine_process
from tritongen.entrypoints.engine_process import Delta, OutputAccumulator, to_delta
from tritongen.types import RequestOutput, RequestTimes, TokenLogprob

OPTS = dict(dtype="float32", device="cpu", num_blocks=256)


def collect(llm, prompt, params):
    async def run():
        return [o async for o in llm.generate(prompt, params)]
    return asyncio.run(run())


def test_accumulator_rebuilds_cumulative_fields_from_deltas():
    acc = OutputAccumulator("r", [1, 2], "Hi")
    first = acc.apply(Delta("r", [5], "a", None, None, -0.5, 1, None, [None, None]))
    last = acc.apply(Delta("r", [6, 7], "bc", "length", None, -1.5, 1, None, None))
    assert (first.token_ids, first.text, first.finished) == ([5], "a", False)
    assert (last.token_ids, last.text, last.delta_text, last.finish_reason) == ([5, 6, 7], "abc", "bc", "length")
    assert last.prompt_token_ids == [1, 2] and last.prompt == "Hi" and last.prompt_logprobs == [None, None]
    assert first.token_ids == [5]  # an earlier output is not changed by later deltas


def test_a_delta_travels_as_plain_tuples_and_comes_back_whole():
    out = RequestOutput("r", [1, 2], "ab", [5, 6], "b", [6], prompt_logprobs=[None, TokenLogprob(2, -0.25)],
                        cumulative_logprob=-1.0, num_cached_tokens=1,
                        times=RequestTimes(10.0, 10.5, 11.0, 12.0))
    wire = pickle.dumps(to_delta(out, first=True), protocol=pickle.HIGHEST_PROTOCOL)
    assert b"Delta" not in wire and b"RequestTimes" not in wire  # no class pickled by name per delta
    d = Delta._make(pickle.loads(wire))
    rebuilt = OutputAccumulator("r", [1, 2], None).apply(d)
    assert rebuilt.times == out.times and rebuilt.delta_token_ids == [6] and rebuilt.delta_text == "b"
    assert rebuilt.prompt_logprobs == out.prompt_logprobs and rebuilt.cumulative_logprob == -1.0
    assert Delta._make(pickle.loads(pickle.dumps(to_delta(out, first=False)))).prompt_logprobs is None


def test_engine_process_is_on_by_default_only_for_cuda():
    import torch

    assert wants_engine_process("cpu") is False
    assert wants_engine_process("cuda:1") is True
    assert wants_engine_process("auto") is torch.cuda.is_available()
    local = AsyncLLM("dummy:tiny-llama", **OPTS)  # engine_process unset, device cpu: a thread
    try:
        assert isinstance(local.engine, EngineCore)
    finally:
        local.shutdown()


def test_same_outputs_as_the_in_process_engine_and_clean_shutdown():
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    prompts = ["The engine process", [5, 6, 7, 8]]
    local = AsyncLLM("dummy:tiny-llama", **OPTS)
    try:
        want = [collect(local, p, params)[-1] for p in prompts]
    finally:
        local.shutdown()
    remote = AsyncLLM("dummy:tiny-llama", engine_process=True, **OPTS)
    proc = remote.engine.proc
    try:
        got = [collect(remote, p, params)[-1] for p in prompts]
        assert remote.max_model_len == local.max_model_len
        assert remote.stats()["kv_blocks_total"] == 256
    finally:
        remote.shutdown()
    assert [(o.token_ids, o.text, o.finish_reason) for o in got] == [(o.token_ids, o.text, o.finish_reason) for o in want]
    for g, w in zip(got, want):
        assert [lp.token_id for lp in g.logprobs] == g.token_ids
        assert [lp.logprob for lp in g.logprobs] == pytest.approx([lp.logprob for lp in w.logprobs], abs=1e-5)
    assert proc.poll() == 0  # the child exited on its own, cleanly


def test_a_model_that_cannot_load_is_a_clear_error():
    with pytest.raises((RuntimeError, ValueError), match="(?i)model|preset|load"):
        AsyncLLM("dummy:no-such-preset", engine_process=True, **OPTS)
