"""Item 1 of issue 21 at its root: every SamplingParams value that validate() accepts runs through a
real engine step without raising (the seed 18446744073709551616 once overflowed
torch.Generator.manual_seed inside the step and failed every request of the batch). Boundary
values go through EngineCore.validate, then all together through steps of dummy:tiny-llama."""
import pytest

from tritongen.config import EngineConfig
from tritongen.entrypoints.llm import create_engine
from tritongen.types import MAX_INT, MAX_STOP_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS, SEED_MAX, SEED_MIN
from tritongen.types import SamplingParams

MAX_LEN = 12


@pytest.fixture(scope="module")
def engine():
    return create_engine(EngineConfig.from_kwargs(model="dummy:tiny-llama", dtype="float32", device="cpu",
                                                  max_model_len=MAX_LEN, num_blocks=256))


def boundary_params(vocab: int) -> list[SamplingParams]:
    sample = dict(temperature=1.0, max_tokens=4)
    return [
        SamplingParams(seed=SEED_MAX, **sample), SamplingParams(seed=SEED_MIN, **sample),
        SamplingParams(seed=0, **sample), SamplingParams(seed=-1, **sample),
        SamplingParams(max_tokens=MAX_INT, ignore_eos=True, temperature=0),  # ends at max_model_len
        SamplingParams(max_tokens=MAX_INT, min_tokens=MAX_INT, temperature=0,
                       stop_token_ids=[vocab - 1] * MAX_STOP_TOKEN_IDS),  # min_tokens masks them all along
        SamplingParams(top_k=MAX_INT, **sample), SamplingParams(top_k=1, **sample),
        SamplingParams(top_p=5e-324, **sample),  # rounds to 0 in float32: the top token must stay
        SamplingParams(min_p=1.0, **sample), SamplingParams(temperature=3.4e38, max_tokens=4),
        SamplingParams(temperature=1e-7, max_tokens=4),
        SamplingParams(repetition_penalty=1.2e-38, **sample), SamplingParams(repetition_penalty=3.4e38, **sample),
        SamplingParams(presence_penalty=-2.0, frequency_penalty=2.0, **sample),
        SamplingParams(logprobs=20, prompt_logprobs=20, **sample),
        SamplingParams(stop=["\ud800" + "x" * (MAX_STOP_CHARS - 1)] * MAX_STOP_STRINGS, **sample),
        SamplingParams(stop_token_ids=[vocab - 1, 0], min_tokens=2, **sample),
    ]


def run(engine, params: list[SamplingParams], prompt=(5, 6, 7, 8)) -> dict:
    for i, p in enumerate(params):
        engine.validate(list(prompt), p)
        engine.add_request(f"b{i}", list(prompt), p)
    final, steps = {}, 0
    while engine.has_unfinished():
        for out in engine.step():  # must never raise
            if out.finished:
                final[out.request_id] = out
        steps += 1
        assert steps < 500
    return final


def test_boundary_values_run_through_the_engine(engine):
    vocab = engine.limits.vocab_size
    params = boundary_params(vocab)
    final = run(engine, params)
    assert len(final) == len(params)
    for out in final.values():
        assert out.error is None and out.finish_reason in ("stop", "length"), (out.request_id, out.error)
        assert all(0 <= t < vocab for t in out.token_ids)
    assert len(final["b4"].token_ids) == MAX_LEN - 4  # max_tokens=2**31-1 ends at max_model_len
    assert final["b3"].token_ids == final["b0"].token_ids  # seed -1 acts as 2**64 - 1
    assert final["b8"].token_ids == final["b7"].token_ids == final["b11"].token_ids  # tiny top_p, top_k=1: greedy
    assert final["b15"].prompt_logprobs[1] is not None and len(final["b15"].logprobs[0].top) == 20
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_seed_gives_the_same_tokens_whatever_else_is_in_the_batch(engine):
    p = SamplingParams(seed=SEED_MAX, temperature=1.0, max_tokens=5, ignore_eos=True)
    alone = run(engine, [p])["b0"].token_ids
    batch = run(engine, [p] + [SamplingParams(temperature=1.0, max_tokens=5)] * 3)
    assert batch["b0"].token_ids == alone


def test_the_engine_refuses_stop_token_ids_outside_its_vocabulary(engine):
    with pytest.raises(ValueError, match="^stop_token_ids"):
        engine.validate([1, 2], SamplingParams(stop_token_ids=[engine.limits.vocab_size]))


def test_max_model_len_beyond_learned_positions_is_refused():
    """GPT-2's position table has no row past its end: a longer max_model_len must be refused at
    load, not fail inside a step (on CUDA a device-side assert ends the process)."""
    from tritongen import LLM
    from tritongen.models.presets import PRESETS

    limit = PRESETS["tiny-gpt2"]["n_positions"]
    with pytest.raises(ValueError, match="learned positions"):
        LLM("dummy:tiny-gpt2", device="cpu", dtype="float32", max_model_len=limit + 1)
