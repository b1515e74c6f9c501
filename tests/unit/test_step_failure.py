"""A step that raises fails only the requests scheduled in it (finish_reason "error", error set,
blocks freed); requests not in that step go on to the same outputs as without the fault; outputs
the step owed (tokens applied before the exception, aborts) are still delivered."""
from __future__ import annotations

import pytest

from fakes import EOS, CharTokenizer, FakeRunner, expected_tokens
from test_pipelined_engine import AsyncFakeRunner
from tritongen.config import SchedulerConfig
from tritongen.core.engine import EngineCore, EngineLimits
from tritongen.types import SamplingParams


class Boom(RuntimeError):
    pass


def make(runner, max_num_seqs=2, async_scheduling=True):
    limits = EngineLimits(max_model_len=256, vocab_size=1000, eos_token_ids=(EOS,))
    eng = EngineCore(runner, CharTokenizer(), limits, SchedulerConfig(max_num_seqs, 64), True)
    eng.async_scheduling = eng.async_scheduling and async_scheduling
    return eng


def fail_on(runner, method: str, when, once=True):
    """Make runner.<method> raise Boom for the (first) step where when(sched) is true."""
    real = getattr(runner, method)
    fired = []

    def patched(sched):
        if when(sched) and not (once and fired):
            fired.append(sched)
            raise Boom("injected")
        return real(sched)
    setattr(runner, method, patched)


def drive(eng, until_done=True):
    """Step like the engine loop does; returns finals by request id and the number of failures."""
    final, failures = {}, 0
    for _ in range(500):
        if not eng.has_unfinished():
            break
        try:
            outs = eng.step()
        except Boom as exc:
            failures += 1
            outs = eng.fail_step(exc)
        for out in outs:
            if out.finished:
                assert out.request_id not in final, "two final outputs"
                final[out.request_id] = out
    return final, failures


PROMPTS = {"a": [1, 2, 3], "b": [4, 5, 6, 7], "c": [8, 9]}
PARAMS = SamplingParams(max_tokens=6, temperature=0)


def check_only_ab_failed(eng, final, runner):
    assert final["a"].finish_reason == final["b"].finish_reason == "error"
    assert final["a"].error == "Boom: injected"
    assert final["c"].finish_reason == "length" and final["c"].error is None
    assert final["c"].token_ids == expected_tokens(PROMPTS["c"], 6)
    bm = eng.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not eng.detokenizers
    assert eng.stats()["num_failed_steps"] == 1
    assert {"a", "b"} <= set(runner.dropped)  # the runner was told the failed requests ended


def test_sequential_step_failure_fails_only_its_requests():
    runner = FakeRunner(32, 4)
    eng = make(runner)
    for rid, prompt in PROMPTS.items():
        eng.add_request(rid, prompt, PARAMS)
    # "c" waits (max_num_seqs=2) while the third step of "a" and "b" raises.
    fail_on(runner, "execute", lambda sched: len(runner.steps) == 2)
    final, failures = drive(eng)
    assert failures == 1
    assert len(final["a"].token_ids) == 2  # the tokens of the steps that worked are kept
    check_only_ab_failed(eng, final, runner)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_pipelined_failure_in_the_wait_fails_the_steps_in_flight(async_scheduling):
    runner = AsyncFakeRunner(32, 4)
    eng = make(runner, async_scheduling=async_scheduling)
    for rid, prompt in PROMPTS.items():
        eng.add_request(rid, prompt, PARAMS)
    real = runner.launch

    def launch(sched):
        wait = real(sched)
        if len(runner.steps) == 3:
            def broken():
                raise Boom("injected")
            return broken
        return wait
    runner.launch = launch
    final, failures = drive(eng)
    assert failures == 1
    check_only_ab_failed(eng, final, runner)


def test_a_request_finished_before_a_failed_launch_still_gets_its_output():
    runner = AsyncFakeRunner(32, 4)
    eng = make(runner, async_scheduling=False)
    eng.add_request("short", [1, 2, 3], SamplingParams(max_tokens=2, temperature=0))
    eng.add_request("long", [4, 5, 6], SamplingParams(max_tokens=50, temperature=0))
    # Step 1 (decode) ends "short" by length; the launch of step 2 raises after that update.
    fail_on(runner, "launch", lambda sched: len(runner.steps) == 2)
    final, failures = drive(eng)
    assert failures == 1
    assert final["short"].finish_reason == "length" and final["short"].token_ids == expected_tokens([1, 2, 3], 2)
    assert final["long"].finish_reason == "error"


def test_an_abort_output_is_not_lost_when_the_step_fails():
    runner = FakeRunner(32, 4)
    eng = make(runner)
    eng.add_request("a", [1, 2, 3], PARAMS)
    eng.add_request("b", [4, 5], PARAMS)
    eng.step()
    eng.abort("b")  # its final output rides on the next step
    fail_on(runner, "execute", lambda sched: True, once=False)
    with pytest.raises(Boom):
        eng.step()
    outs = {o.request_id: o for o in eng.fail_step(Boom("injected"))}
    assert outs["b"].finish_reason == "abort" and outs["a"].finish_reason == "error"
    assert not eng.has_unfinished()


def test_unscheduled_requests_are_untouched_and_the_engine_serves_on():
    runner = FakeRunner(32, 4)
    eng = make(runner, max_num_seqs=1)
    for rid in "xyz":
        eng.add_request(rid, [ord(rid) % 50, 3], PARAMS)
    fail_on(runner, "execute", lambda sched: any(s.request_id == "x" for s in sched.seqs))
    final, failures = drive(eng)
    assert failures == 1 and final["x"].finish_reason == "error"
    for rid in "yz":
        assert final[rid].token_ids == expected_tokens([ord(rid) % 50, 3], 6)
