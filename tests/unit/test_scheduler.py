"""Scheduler + EngineCore against a fake paged runner: no torch, no model."""
import random

import pytest

from fakes import EOS, CharTokenizer, FakeRunner, expected_tokens
from tritongen.config import SchedulerConfig
from tritongen.core.engine import EngineCore, EngineLimits
from tritongen.types import SamplingParams


def make_engine(num_blocks=64, block_size=4, budget=64, max_seqs=16, max_len=512, prefix=True, **kw):
    runner = FakeRunner(num_blocks, block_size, **kw)
    limits = EngineLimits(max_model_len=max_len, vocab_size=1000, eos_token_ids=(EOS,))
    eng = EngineCore(runner, CharTokenizer(), limits, SchedulerConfig(max_seqs, budget), prefix)
    return eng, runner


def run_all(eng):
    final = {}
    steps = 0
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                final[out.request_id] = out
        steps += 1
        assert steps < 10_000, "engine did not converge"
    return final


def random_prompts(n, seed=0, lo=1, hi=40):
    rng = random.Random(seed)
    return [[rng.randrange(0, 900) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def test_outputs_match_reference_when_batched():
    eng, runner = make_engine()
    prompts = random_prompts(20)
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=12, temperature=0))
    final = run_all(eng)
    for i, p in enumerate(prompts):
        assert final[f"r{i}"].token_ids == expected_tokens(p, 12)
        assert final[f"r{i}"].finish_reason == "length"
    assert eng.stats()["kv_blocks_free"] == 64
    assert max(len(s.seqs) for s in runner.steps) > 1  # really batched


def test_chunked_prefill_respects_budget():
    eng, runner = make_engine(budget=16)
    prompt = list(range(50))
    eng.add_request("long", prompt, SamplingParams(max_tokens=4))
    eng.add_request("short", [5, 6], SamplingParams(max_tokens=4))
    final = run_all(eng)
    assert all(s.num_batched_tokens <= 16 for s in runner.steps)
    first = runner.steps[0].seqs[0]
    assert first.num_new_tokens == 16 and not first.do_sample
    assert final["long"].token_ids == expected_tokens(prompt, 4)
    assert final["short"].token_ids == expected_tokens([5, 6], 4)


def test_decode_and_prefill_share_a_step():
    eng, runner = make_engine(budget=32)
    eng.add_request("a", [1, 2, 3], SamplingParams(max_tokens=5))
    eng.step()
    eng.add_request("b", list(range(10)), SamplingParams(max_tokens=5))
    eng.step()
    kinds = {(s.request_id, s.num_new_tokens) for s in runner.steps[-1].seqs}
    assert kinds == {("a", 1), ("b", 10)}


def test_preemption_recomputes_and_keeps_outputs_exact():
    eng, runner = make_engine(num_blocks=12, block_size=4, budget=64, max_seqs=8)
    prompts = random_prompts(8, seed=3, lo=5, hi=12)
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=20))
    final = run_all(eng)
    assert eng.scheduler.num_preemptions > 0
    for i, p in enumerate(prompts):
        assert final[f"r{i}"].token_ids == expected_tokens(p, 20)
    assert eng.stats()["kv_blocks_free"] == 12


def test_preemption_takes_newest_first():
    eng, runner = make_engine(num_blocks=6, block_size=4, budget=64)
    eng.add_request("old", [1] * 8, SamplingParams(max_tokens=12))
    eng.add_request("new", [2] * 8, SamplingParams(max_tokens=12))
    preempted = []
    while eng.has_unfinished():
        eng.step()
        preempted += runner.steps[-1].preempted_request_ids
    assert preempted and set(preempted) == {"new"}


def test_fcfs_no_starvation_of_big_request():
    eng, runner = make_engine(num_blocks=20, block_size=4, budget=128, max_seqs=4)
    eng.add_request("big", list(range(60)), SamplingParams(max_tokens=4))
    for i in range(30):
        eng.add_request(f"s{i}", [i + 1], SamplingParams(max_tokens=2))
    order = []
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                order.append(out.request_id)
    assert order.index("big") < order.index("s10")


def test_prefix_cache_hits_and_same_output():
    eng, runner = make_engine()
    shared = list(range(100, 130))
    eng.add_request("a", shared + [1], SamplingParams(max_tokens=3))
    run_all(eng)
    eng.add_request("b", shared + [2], SamplingParams(max_tokens=3))
    final = run_all(eng)
    assert final["b"].num_cached_tokens == 28
    assert final["b"].token_ids == expected_tokens(shared + [2], 3)
    assert runner.steps[-3].seqs[0].start_pos == 28
    assert eng.stats()["prefix_cache_hit_rate"] > 0


def test_eos_min_tokens_ignore_eos_and_stop_token_ids():
    eng, _ = make_engine(eos_after={"eos": 2, "min": 1, "ign": 1})
    eng.add_request("eos", [1, 2], SamplingParams(max_tokens=10))
    eng.add_request("min", [1, 2], SamplingParams(max_tokens=10, min_tokens=5))
    eng.add_request("ign", [1, 2], SamplingParams(max_tokens=6, ignore_eos=True))
    stop_tok = expected_tokens([3, 4], 3)[2]
    eng.add_request("stoptok", [3, 4], SamplingParams(max_tokens=10, stop_token_ids=[stop_tok]))
    final = run_all(eng)
    assert final["eos"].token_ids[-1] == EOS and len(final["eos"].token_ids) == 3
    assert final["eos"].finish_reason == "stop"
    assert final["min"].finish_reason == "length"  # fake emitted EOS at 1 < min_tokens: ignored
    assert len(final["ign"].token_ids) == 6 and final["ign"].finish_reason == "length"
    assert final["stoptok"].token_ids[-1] == stop_tok and final["stoptok"].finish_reason == "stop"


def test_stop_string_cut_and_deltas_concatenate():
    eng, _ = make_engine()
    toks = expected_tokens([10, 11], 12)
    text = CharTokenizer().decode(toks)
    stop = text[5:8]  # spans three tokens
    eng.add_request("s", [10, 11], SamplingParams(max_tokens=12, stop=[stop]))
    deltas, final = [], None
    while eng.has_unfinished():
        for out in eng.step():
            deltas.append(out.delta_text)
            final = out
    assert final.finish_reason == "stop"
    assert final.text == text[: text.index(stop)]
    assert "".join(deltas) == final.text


def test_abort_frees_blocks_and_reports():
    eng, runner = make_engine()
    eng.add_request("a", list(range(20)), SamplingParams(max_tokens=50))
    eng.add_request("b", list(range(5)), SamplingParams(max_tokens=3))
    eng.step()
    out = eng.abort("a")
    assert out.finish_reason == "abort"
    final = run_all(eng)
    assert final["a"].finish_reason == "abort"
    assert final["b"].token_ids == expected_tokens(list(range(5)), 3)
    assert eng.stats()["kv_blocks_free"] == eng.stats()["kv_blocks_total"]
    assert "a" in runner.dropped


@pytest.mark.parametrize("prompt,params,match", [
    ("", SamplingParams(), "empty"),
    ([], SamplingParams(), "empty"),
    ([1, 5000], SamplingParams(), "vocabulary"),
    ([1] * 600, SamplingParams(), "600 tokens.*max_model_len is 512"),
    ([1], SamplingParams(max_tokens=0), "max_tokens"),
    ([1], SamplingParams(top_p=0), "top_p"),
    ([1], SamplingParams(temperature=-1), "temperature"),
    ([1], SamplingParams(top_k=-2), "top_k"),
])
def test_bad_input_is_rejected_with_a_clear_error(prompt, params, match):
    eng, _ = make_engine(num_blocks=200)
    with pytest.raises(ValueError, match=match):
        eng.add_request("x", prompt, params)
    assert not eng.has_unfinished()


def test_duplicate_request_id():
    eng, _ = make_engine()
    eng.add_request("x", [1], SamplingParams())
    with pytest.raises(ValueError, match="already in use"):
        eng.add_request("x", [1], SamplingParams())


def test_max_model_len_caps_generation():
    eng, _ = make_engine(max_len=20)
    eng.add_request("x", list(range(15)), SamplingParams(max_tokens=100))
    final = run_all(eng)
    assert len(final["x"].token_ids) == 5 and final["x"].finish_reason == "length"


def test_max_num_seqs_limits_running():
    eng, runner = make_engine(max_seqs=3)
    for i in range(10):
        eng.add_request(f"r{i}", [i + 1], SamplingParams(max_tokens=3))
    run_all(eng)
    assert max(len(s.seqs) for s in runner.steps) == 3


def _decode_step(eng, params_list, prompt_len=6):
    """Requests admitted and prefilled in one step; returns that step (still 'in flight')."""
    for i, params in enumerate(params_list):
        eng.add_request(f"r{i}", list(range(10 + i, 10 + i + prompt_len)), params)
    return eng.scheduler.schedule()


def test_schedule_ahead_decodes_the_token_in_flight_at_the_next_position():
    eng, _ = make_engine(block_size=4)
    prev = _decode_step(eng, [SamplingParams(max_tokens=5, temperature=0)] * 2, prompt_len=7)
    ahead = eng.scheduler.schedule_ahead(prev)
    assert ahead is not None and ahead.input_from_previous
    for s, p in zip(ahead.seqs, prev.seqs):
        assert (s.request_id, s.start_pos, s.num_new_tokens, s.do_sample) == (p.request_id, 7, 1, True)
        assert len(s.block_table) == 2  # position 7 fits the 2nd block; position 8 (after it) is not booked
    eng2, _ = make_engine(block_size=4)
    prev = _decode_step(eng2, [SamplingParams(max_tokens=5, temperature=0)], prompt_len=8)
    assert len(eng2.scheduler.schedule_ahead(prev).seqs[0].block_table) == 3  # position 8 opens block 3


@pytest.mark.parametrize("params, why", [
    (SamplingParams(max_tokens=1, temperature=0), "the step in flight ends it by length: nothing left"),
    (SamplingParams(max_tokens=9, temperature=0, repetition_penalty=1.2), "penalties read the tokens"),
    (SamplingParams(max_tokens=9, temperature=0, presence_penalty=0.5), "penalties read the tokens"),
    (SamplingParams(max_tokens=9, temperature=0, min_tokens=1), "the step where min_tokens stops masking"),
])
def test_schedule_ahead_refuses_what_needs_the_tokens_in_flight(params, why):
    eng, _ = make_engine()
    prev = _decode_step(eng, [params])
    assert eng.scheduler.schedule_ahead(prev) is None, why


def test_schedule_ahead_leaves_prefill_chunks_to_schedule_and_admits_after_the_decodes():
    eng, _ = make_engine(budget=4)  # a 6-token prompt needs two chunks
    prev = _decode_step(eng, [SamplingParams(max_tokens=9, temperature=0)])
    assert not prev.seqs[0].do_sample and eng.scheduler.schedule_ahead(prev) is None
    eng, _ = make_engine(max_seqs=4)
    prev = _decode_step(eng, [SamplingParams(max_tokens=9, temperature=0)])
    eng.add_request("late", [1, 2, 3], SamplingParams(max_tokens=3, temperature=0))
    ahead = eng.scheduler.schedule_ahead(prev)
    assert [(s.request_id, s.start_pos, s.num_new_tokens) for s in ahead.seqs] == [("r0", 6, 1), ("late", 0, 3)]
    assert ahead.previous_rows == [0] and ahead.num_previous == 1 and ahead.seqs[1].token_ids == [1, 2, 3]
    eng, _ = make_engine(max_seqs=1)
    prev = _decode_step(eng, [SamplingParams(max_tokens=9, temperature=0)])
    eng.add_request("late", [1, 2, 3], SamplingParams(max_tokens=3, temperature=0))
    assert [s.request_id for s in eng.scheduler.schedule_ahead(prev).seqs] == ["r0"]  # no room for "late"


def test_schedule_ahead_leaves_out_what_the_step_in_flight_ends_by_length():
    eng, _ = make_engine()
    prev = _decode_step(eng, [SamplingParams(max_tokens=1, temperature=0), SamplingParams(max_tokens=5, temperature=0),
                              SamplingParams(max_tokens=1, temperature=0), SamplingParams(max_tokens=5, temperature=0)])
    ahead = eng.scheduler.schedule_ahead(prev)
    assert [s.request_id for s in ahead.seqs] == ["r1", "r3"]
    assert ahead.previous_rows == [1, 3] and ahead.num_previous == 4


def test_schedule_ahead_without_a_free_block_waits_for_schedule():
    eng, _ = make_engine(num_blocks=4, block_size=4)
    prev = _decode_step(eng, [SamplingParams(max_tokens=9, temperature=0)] * 2, prompt_len=8)
    assert eng.scheduler.schedule_ahead(prev) is None  # position 8 needs a 3rd block each


def test_schedule_ahead_keeps_min_tokens_masking_right():
    """The sampler decides on the host, from the output count it sees (one short while the step
    ahead is launched): only the step where that count crosses min_tokens must wait."""
    for min_tokens, ahead_ok in ((1, False), (2, True), (0, True)):
        eng, _ = make_engine()
        prev = _decode_step(eng, [SamplingParams(max_tokens=9, temperature=0, min_tokens=min_tokens)])
        assert (eng.scheduler.schedule_ahead(prev) is not None) == ahead_ok, min_tokens


def test_fixed_length_requests_run_ahead_until_their_last_token():
    eng, runner = make_engine()
    eng.runner.asynchronous = eng.pipelined = eng.async_scheduling = True
    eng.runner.launch = lambda sched: (lambda out: lambda: out)(runner.execute(sched))
    eng.add_request("a", [1, 2, 3], SamplingParams(max_tokens=6, min_tokens=6, ignore_eos=True, temperature=0))
    final = run_all(eng)
    assert final["a"].token_ids == expected_tokens([1, 2, 3], 6)
    assert [st.input_from_previous for st in runner.steps if st.seqs] == [False] + [True] * 5
