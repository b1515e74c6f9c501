"""AsyncLLM: concurrent streams, bad input, early exit aborts, a failing request stays alone."""
import asyncio

import pytest

from tritongen import AsyncLLM, SamplingParams


@pytest.fixture(scope="module", params=["sequential", "async", "process"])
def llm(request):
    """The CPU loop, the CUDA default forced on CPU: pipelined with asynchronous scheduling
    (aborts, failures and early exits then hit requests that have a step running ahead), and the
    engine loop in a child process (engine_process=True)."""
    engine = AsyncLLM("dummy:tiny-llama", dtype="float32", device="cpu", engine_process=request.param == "process")
    if request.param == "async":
        engine.engine.pipelined = engine.engine.async_scheduling = True
    yield engine
    engine.shutdown()


def collect(llm, prompt, params, rid=None):
    async def run():
        return [o async for o in llm.generate(prompt, params, rid)]
    return asyncio.run(run())


def test_stream_deltas_add_up(llm):
    outs = collect(llm, "Hello there", SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    final = outs[-1]
    assert final.finished and final.finish_reason == "length"
    assert sum(len(o.delta_token_ids) for o in outs) == 10 == len(final.token_ids)
    assert "".join(o.delta_text for o in outs) == final.text
    assert final.num_prompt_tokens == len(llm.tokenizer.encode("Hello there"))


def test_concurrent_streams_match_sequential(llm):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = [[i + 1, i + 2, i + 3] for i in range(12)]
    seq = [collect(llm, p, params)[-1].token_ids for p in prompts]

    async def run():
        async def one(p):
            return [o async for o in llm.generate(p, params)][-1].token_ids
        return await asyncio.gather(*(one(p) for p in prompts))

    assert asyncio.run(run()) == seq


@pytest.mark.parametrize("prompt,params,match", [
    ("", SamplingParams(), "empty"),
    ([1, 10 ** 7], SamplingParams(), "vocabulary"),
    ([1] * 5000, SamplingParams(), "max_model_len"),
    ("hi", SamplingParams(max_tokens=0), "max_tokens"),
    ("hi", SamplingParams(top_p=1.5), "top_p"),
])
def test_bad_input_raises_and_engine_keeps_serving(llm, prompt, params, match):
    with pytest.raises(ValueError, match=match):
        collect(llm, prompt, params)
    ok = collect(llm, "fine", SamplingParams(max_tokens=2, ignore_eos=True))
    assert ok[-1].finished and len(ok[-1].token_ids) == 2


def test_breaking_out_aborts_and_frees_blocks(llm):
    async def run():
        gen = llm.generate("x y z", SamplingParams(max_tokens=1000, ignore_eos=True), "leaver")
        async for _ in gen:
            break
        await gen.aclose()
        for _ in range(100):
            st = llm.stats()
            if st["num_running"] == 0 and st["kv_blocks_free"] == st["kv_blocks_total"]:
                return st
            await asyncio.sleep(0.02)
        return llm.stats()

    st = asyncio.run(run())
    assert st["num_running"] == 0 and st["kv_blocks_free"] == st["kv_blocks_total"]


def test_one_failing_request_does_not_take_down_others(llm):
    if not hasattr(llm.engine, "detokenizers"):
        pytest.skip("the detokenizers live in the engine process")
    detoks = llm.engine.detokenizers
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)

    async def run():
        async def poisoned():
            gen = llm.generate("poison", SamplingParams(max_tokens=500, ignore_eos=True), "poisoned")
            first = await gen.__anext__()
            if not first.finished:  # break its detokenizer from outside: the next step raises for it alone
                detoks["poisoned"].tokenizer = None
            return [first] + [o async for o in gen]

        async def healthy():
            return [o async for o in llm.generate("healthy", params, "healthy")]

        return await asyncio.gather(poisoned(), healthy())

    bad, good = asyncio.run(run())
    assert bad[-1].finish_reason == "error" and bad[-1].error
    assert good[-1].finish_reason == "length" and len(good[-1].token_ids) == 5


def test_a_consumer_that_falls_behind_gets_merged_deltas(llm):
    """A caller blocked for a while (a slow response send) reads the steps it missed as one output
    whose deltas (ids, text, logprobs) add up to the same stream as a caller that keeps up."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=1)
    prompt = "Merging deltas"
    fast = collect(llm, prompt, params)

    async def slow():
        outs = []
        async for out in llm.generate(prompt, params):
            outs.append(out)
            if len(outs) == 2:
                await asyncio.sleep(0.3)  # the engine runs on; several steps queue up meanwhile
        return outs

    outs = asyncio.run(slow())
    assert max(len(o.delta_token_ids) for o in outs) > 1  # steps were merged
    assert [t for o in outs for t in o.delta_token_ids] == outs[-1].token_ids == fast[-1].token_ids
    assert "".join(o.delta_text for o in outs) == outs[-1].text == fast[-1].text
    assert [lp.token_id for o in outs for lp in o.delta_logprobs] == fast[-1].token_ids


def test_open_hands_every_step_to_the_consumer_on_its_loop(llm):
    """open(): no task per request; each step's output arrives unmerged on the caller's loop
    thread, and many requests' streams add up to what generate() gives."""
    import threading

    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = [f"open stream {i}" for i in range(6)]
    want = [collect(llm, p, params)[-1] for p in prompts]

    async def run():
        loop_thread = threading.current_thread()
        got = {p: [] for p in prompts}
        done = {p: asyncio.get_running_loop().create_future() for p in prompts}

        def on_item(p, item):
            assert threading.current_thread() is loop_thread
            got[p].append(item)
            if isinstance(item, BaseException) or item.finished:
                done[p].set_result(None)

        streams = [llm.open(p, params, f"open-{i}", lambda item, p=p: on_item(p, item)) for i, p in enumerate(prompts)]
        await asyncio.wait_for(asyncio.gather(*done.values()), 60)
        for s in streams:
            assert s.ended
            s.close()
        return got

    got = asyncio.run(run())
    for p, final in zip(prompts, want):
        outs = got[p]
        assert all(len(o.delta_token_ids) <= 1 for o in outs)  # one step each, never merged
        assert [t for o in outs for t in o.delta_token_ids] == outs[-1].token_ids == final.token_ids
        assert "".join(o.delta_text for o in outs) == outs[-1].text == final.text


def test_open_closed_early_aborts_and_frees_blocks(llm):
    async def run():
        first = asyncio.get_running_loop().create_future()
        items = []

        def on_item(item):
            items.append(item)
            if not first.done():
                first.set_result(None)

        stream = llm.open("x y z", SamplingParams(max_tokens=1000, ignore_eos=True), "open-leaver", on_item)
        await first
        stream.close()
        seen = len(items)
        for _ in range(100):
            st = llm.stats()
            if st["num_running"] == 0 and st["kv_blocks_free"] == st["kv_blocks_total"]:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.05)
        return llm.stats(), seen, items

    st, seen, items = asyncio.run(run())
    assert st["num_running"] == 0 and st["kv_blocks_free"] == st["kv_blocks_total"]
    assert len(items) == seen and not items[-1].finished  # nothing delivered after close()
    with pytest.raises(ValueError, match="empty"):
        asyncio.run(_open_now(llm, "", SamplingParams()))


async def _open_now(llm, prompt, params):
    return llm.open(prompt, params, "open-bad", lambda item: None)
