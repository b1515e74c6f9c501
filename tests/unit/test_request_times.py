"""Engine-side request times (RequestOutput.times): arrival <= first scheduled <= first token <= last
token, on the wall clock the caller reads, through the in-process engine and the engine process."""
import time

import pytest

from tritongen import LLM, SamplingParams


@pytest.mark.parametrize("engine_process", [False, True])
def test_times_are_monotonic_and_inside_the_callers_window(engine_process):
    import asyncio

    from tritongen.entrypoints.async_engine import AsyncLLM

    async def run():
        engine = AsyncLLM(model="dummy:tiny-llama", dtype="float32", device="cpu", num_blocks=32,
                          engine_process=engine_process)
        try:
            before = time.time()
            outs = [o async for o in engine.generate("hello there", SamplingParams(max_tokens=4, ignore_eos=True),
                                                     request_id="r")]
            return before, time.time(), outs
        finally:
            engine.shutdown()

    before, after, outs = asyncio.run(run())
    t = outs[-1].times
    assert before <= t.arrival_time <= t.first_scheduled_time <= t.first_token_time < t.last_token_time <= after
    assert outs[0].times.first_token_time == t.first_token_time  # set once, by the first token


def test_offline_outputs_carry_times():
    out = LLM(model="dummy:tiny-llama", dtype="float32", device="cpu", num_blocks=32).generate(
        ["hi"], SamplingParams(max_tokens=2, ignore_eos=True))[0]
    assert out.times.arrival_time <= out.times.first_scheduled_time <= out.times.last_token_time
