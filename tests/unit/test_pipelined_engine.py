"""The pipelined engine loop (one step in flight, outputs emitted while the device runs the next
step), with and without asynchronous scheduling (the next decode step launched before the one in
flight is done), against the sequential loop: same outputs, same freed blocks, order of events."""
from __future__ import annotations

import pytest

from fakes import EOS, CharTokenizer, FakeRunner
from tritongen.config import SchedulerConfig
from tritongen.core.engine import EngineCore, EngineLimits
from tritongen.types import ModelOutput, SamplingParams, SchedulerOutput


class AsyncFakeRunner(FakeRunner):
    """launch() 'queues' the step (computed at once, as a device would) and the returned function
    is the wait; both are logged."""

    asynchronous = True
    supports_input_from_previous = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[tuple[str, int]] = []

    def launch(self, sched: SchedulerOutput):
        k = len(self.steps)
        out = self.execute(sched)
        self.events.append(("launch", k))

        def wait() -> ModelOutput:
            self.events.append(("wait", k))
            return out

        return wait


def make(runner_cls, num_blocks=24, async_scheduling=True, **kw):
    runner = runner_cls(num_blocks, 4, **kw)
    limits = EngineLimits(max_model_len=256, vocab_size=1000, eos_token_ids=(EOS,))
    eng = EngineCore(runner, CharTokenizer(), limits, SchedulerConfig(6, 32), True)
    eng.async_scheduling = eng.async_scheduling and async_scheduling
    return eng, runner


def requests():
    """Prompts and params covering greedy, stop strings, EOS, min_tokens and logprobs."""
    reqs = []
    for i in range(14):
        prompt = [(i * 37 + j * 11) % 900 for j in range(5 + 3 * i)]
        params = SamplingParams(max_tokens=10 + i % 5, temperature=0, logprobs=0 if i % 3 == 0 else None)
        reqs.append((f"r{i}", prompt, params))
    return reqs


def run(eng, reqs, stop_text=None):
    for rid, prompt, params in reqs:
        if stop_text is not None and rid in ("r2", "r7"):
            params = SamplingParams(max_tokens=params.max_tokens, temperature=0, stop=[stop_text])
        eng.add_request(rid, prompt, params)
    final, steps = {}, 0
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                final[out.request_id] = out
        steps += 1
        assert steps < 5000
    return final


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("num_blocks", [24, 64])  # 24: preemption by recompute happens
def test_pipelined_outputs_equal_sequential(num_blocks: int, async_scheduling: bool) -> None:
    reqs = requests()
    seq_eng, _ = make(FakeRunner, num_blocks, eos_after={"r4": 3})
    pipe_eng, runner = make(AsyncFakeRunner, num_blocks, async_scheduling, eos_after={"r4": 3})
    assert not seq_eng.pipelined and pipe_eng.pipelined and pipe_eng.async_scheduling == async_scheduling
    expected = run(seq_eng, reqs)
    got = run(pipe_eng, reqs)
    assert got.keys() == expected.keys()
    for rid, out in expected.items():
        g = got[rid]
        assert (g.token_ids, g.text, g.finish_reason) == (out.token_ids, out.text, out.finish_reason), rid
        assert (g.logprobs is None) == (out.logprobs is None)
    assert got["r4"].finish_reason == "stop" and len(got["r4"].token_ids) == 4
    bm = pipe_eng.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not pipe_eng.detokenizers
    if num_blocks == 24:
        assert pipe_eng.scheduler.num_preemptions > 0
    ahead = sum(st.input_from_previous for st in runner.steps)
    assert (ahead > len(runner.steps) // 2) if async_scheduling else ahead == 0


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_stop_string_found_one_step_late_gives_the_same_text(async_scheduling: bool) -> None:
    reqs = requests()
    seq_eng, seq_runner = make(FakeRunner, 64)
    pipe_eng, pipe_runner = make(AsyncFakeRunner, 64, async_scheduling)
    # A character the greedy fake emits early for r2 and r7: take it from a plain run.
    probe, _ = make(FakeRunner, 64)
    text = run(probe, reqs)["r2"].text
    stop = text[3]
    expected = run(seq_eng, reqs, stop)
    got = run(pipe_eng, reqs, stop)
    for rid in ("r2", "r7"):
        assert (got[rid].text, got[rid].token_ids, got[rid].finish_reason) == \
            (expected[rid].text, expected[rid].token_ids, expected[rid].finish_reason)
    assert expected["r2"].finish_reason == "stop" and stop not in expected["r2"].text
    # The request ran one more step on the device than the sequential loop needed, and only one.
    count = lambda runner, rid: sum(any(s.request_id == rid for s in st.seqs) for st in runner.steps)  # noqa: E731
    assert count(pipe_runner, "r2") == count(seq_runner, "r2") + 1
    assert pipe_eng.block_manager.num_free_blocks == pipe_eng.block_manager.num_blocks


def test_outputs_of_a_step_are_emitted_after_the_next_step_is_launched() -> None:
    eng, runner = make(AsyncFakeRunner, 64, async_scheduling=False)
    eng.add_request("a", [1, 2, 3], SamplingParams(max_tokens=3, temperature=0))
    assert eng.step() == []  # step 0 launched, nothing to emit yet
    assert runner.events == [("launch", 0)]
    outs = eng.step()
    assert [len(o.token_ids) for o in outs] == [1]
    assert runner.events[-2:] == [("wait", 0), ("launch", 1)]  # emitted while step 1 is in flight
    while eng.has_unfinished():
        outs = eng.step()
    assert outs[-1].finished and len(outs[-1].token_ids) == 3


def test_fail_all_drops_the_step_in_flight() -> None:
    eng, runner = make(AsyncFakeRunner, 64)
    eng.add_request("a", [1, 2, 3], SamplingParams(max_tokens=5, temperature=0))
    eng.step()
    outs = eng.fail_all(RuntimeError("device lost"))
    assert [o.error for o in outs] == ["RuntimeError: device lost"]
    assert not eng.has_unfinished()


def test_async_scheduling_launches_the_next_decode_before_waiting() -> None:
    eng, runner = make(AsyncFakeRunner, 64)
    eng.add_request("a", [1, 2, 3], SamplingParams(max_tokens=4, temperature=0))
    eng.step()  # the prefill, scheduled the usual way
    outs = eng.step()
    assert runner.events == [("launch", 0), ("launch", 1), ("wait", 0)] and len(outs[0].token_ids) == 1
    assert runner.steps[1].input_from_previous and runner.steps[1].seqs[0].start_pos == 3
    while eng.has_unfinished():
        outs = eng.step()
    # The end (max_tokens) is known in advance: no step is scheduled past it.
    steps = [st for st in runner.steps if st.seqs]
    assert outs[-1].finish_reason == "length" and len(outs[-1].token_ids) == 4
    assert [st.input_from_previous for st in steps] == [False, True, True, True]


def test_a_request_ended_by_eos_drops_the_token_computed_ahead() -> None:
    reqs = [("a", [1, 2, 3], SamplingParams(max_tokens=10, temperature=0)),
            ("b", [4, 5, 6, 7], SamplingParams(max_tokens=6, temperature=0))]
    eng, _ = make(AsyncFakeRunner, 64, eos_after={"a": 2})
    final = run(eng, reqs)
    want = run(make(FakeRunner, 64, eos_after={"a": 2})[0], reqs)
    assert final["a"].token_ids[-1] == EOS and len(final["a"].token_ids) == 3
    for rid in "ab":
        assert (final[rid].token_ids, final[rid].finish_reason) == (want[rid].token_ids, want[rid].finish_reason)
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


def test_async_scheduling_can_be_turned_off() -> None:
    limits = EngineLimits(max_model_len=256, vocab_size=1000, eos_token_ids=(EOS,))
    off = EngineCore(AsyncFakeRunner(64, 4), CharTokenizer(), limits, SchedulerConfig(6, 32, async_scheduling=False))
    on = EngineCore(AsyncFakeRunner(64, 4), CharTokenizer(), limits, SchedulerConfig(6, 32))
    assert off.pipelined and not off.async_scheduling and on.async_scheduling
    off.add_request("a", [1, 2, 3], SamplingParams(max_tokens=5, temperature=0))
    while off.has_unfinished():
        off.step()
    assert not any(st.input_from_previous for st in off.runner.steps)


def test_engine_counts_its_steps() -> None:
    eng, runner = make(AsyncFakeRunner, 64)
    final = run(eng, requests())
    launched = [st for st in runner.steps if st.seqs]
    st = eng.stats()
    assert len(final) == 14 and st["num_steps"] == len(launched)
    assert st["num_steps_ahead"] == sum(s.input_from_previous for s in launched) > 0
    with_prompt = sum(any(s.num_new_tokens > 1 or not s.do_sample for s in x.seqs) for x in launched)
    assert st["num_prefill_steps"] == with_prompt and 0 < with_prompt < len(launched)


class SlowRunner(AsyncFakeRunner):
    """Each step's result comes `prefill_s` after its wait starts when it carries prompt tokens,
    `decode_s` when it only decodes (sequential mode: execute() takes that long)."""

    decode_s, prefill_s = 0.004, 0.04

    def _delay(self, sched: SchedulerOutput) -> float:
        return self.prefill_s if any(s.num_new_tokens > 1 or not s.do_sample for s in sched.seqs) else self.decode_s

    def launch(self, sched: SchedulerOutput):
        import time

        wait, delay = super().launch(sched), self._delay(sched)
        return lambda: (time.sleep(delay), wait())[1]

    def execute(self, sched: SchedulerOutput) -> ModelOutput:
        import time

        if not self.asynchronous:
            time.sleep(self._delay(sched))
        return super().execute(sched)


@pytest.mark.parametrize("pipelined", [True, False])
def test_engine_times_steps_with_and_without_prompt_tokens(pipelined: bool) -> None:
    """step_seconds: each step from its start to its result, by kind, so that their means over
    num_steps / num_prefill_steps are the lengths of each kind of step (the metrics'
    tritongen_engine_{decode,prefill}_step_seconds_total)."""
    import time

    runner_cls = SlowRunner if pipelined else type("SeqSlowRunner", (SlowRunner,), {"asynchronous": False})
    eng, _ = make(runner_cls, 64)
    assert eng.pipelined == pipelined
    t0 = time.perf_counter()
    run(eng, requests()[:6])
    wall = time.perf_counter() - t0
    st = eng.stats()
    decode_steps = st["num_steps"] - st["num_prefill_steps"]
    assert decode_steps > 0 and st["num_prefill_steps"] > 0
    decode_mean = st["decode_step_seconds"] / decode_steps
    prefill_mean = st["prefill_step_seconds"] / st["num_prefill_steps"]
    assert SlowRunner.decode_s <= decode_mean < SlowRunner.prefill_s <= prefill_mean
    assert st["decode_step_seconds"] + st["prefill_step_seconds"] <= wall
