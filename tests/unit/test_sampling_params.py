"""SamplingParams.validate(): every value that would fail the engine later is refused here, with a
message that starts with the field's name (the OpenAI front reads `param` from it, the Triton front
answers INVALID_ARG with it); the boundary values themselves pass (and run: tests/e2e/test_param_bounds.py)."""
import pytest

from tritongen.types import MAX_INT, MAX_STOP_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS, SEED_MAX, SEED_MIN
from tritongen.types import SamplingParams

NAN, INF = float("nan"), float("inf")

BAD = [
    ("seed", 2 ** 64), ("seed", SEED_MIN - 1), ("seed", True), ("seed", 1.5), ("seed", "7"),
    ("max_tokens", 0), ("max_tokens", MAX_INT + 1), ("max_tokens", 10 ** 5000), ("max_tokens", True),
    ("max_tokens", 4.0), ("max_tokens", "4"), ("max_tokens", None),
    ("min_tokens", -1), ("min_tokens", MAX_INT + 1), ("min_tokens", False),
    ("top_k", -2), ("top_k", MAX_INT + 1), ("top_k", True), ("top_k", 2.0),
    ("logprobs", 21), ("logprobs", -1), ("logprobs", True), ("prompt_logprobs", 10 ** 30),
    ("temperature", NAN), ("temperature", INF), ("temperature", -0.1), ("temperature", 1e39),
    ("temperature", True), ("temperature", "1"), ("temperature", 10 ** 400), ("temperature", None),
    ("top_p", 0.0), ("top_p", NAN), ("top_p", 1.0000001), ("top_p", False),
    ("min_p", NAN), ("min_p", -0.01), ("min_p", 1.5), ("min_p", INF),
    ("repetition_penalty", 0.0), ("repetition_penalty", 1e-39), ("repetition_penalty", INF),
    ("repetition_penalty", NAN), ("presence_penalty", 2.5), ("presence_penalty", NAN),
    ("frequency_penalty", -INF), ("frequency_penalty", True),
    ("ignore_eos", 1), ("ignore_eos", "false"), ("skip_special_tokens", None),
    ("include_stop_str_in_output", "yes"),
    ("stop", 5), ("stop", [""]), ("stop", [5]), ("stop", ["x"] * (MAX_STOP_STRINGS + 1)),
    ("stop", ["x" * (MAX_STOP_CHARS + 1)]), ("stop", {"a": 1}),
    ("stop_token_ids", [-1]), ("stop_token_ids", [True]), ("stop_token_ids", [1.0]), ("stop_token_ids", 5),
    ("stop_token_ids", [MAX_INT + 1]), ("stop_token_ids", [1] * (MAX_STOP_TOKEN_IDS + 1)),
]


def _id(name, value):
    return f"{name}=<{value.bit_length()}-bit int>" if isinstance(value, int) and value > 2 ** 64 else f"{name}={value!r:.20}"


@pytest.mark.parametrize("name,value", BAD, ids=[_id(n, v) for n, v in BAD])
def test_bad_values_are_refused_naming_the_field(name, value):
    with pytest.raises(ValueError) as err:
        SamplingParams(**{name: value}).validate()
    assert str(err.value).split()[0] == name, str(err.value)
    assert len(str(err.value)) < 300  # a 5000-digit number is not echoed back


def test_stop_token_ids_outside_the_vocabulary_are_refused_when_it_is_known():
    SamplingParams(stop_token_ids=[99]).validate(vocab_size=100)
    SamplingParams(stop_token_ids=[100]).validate()  # no vocabulary known: only the general bound
    with pytest.raises(ValueError, match=r"^stop_token_ids .*\[0, 99\]"):
        SamplingParams(stop_token_ids=[100]).validate(vocab_size=100)


def test_min_tokens_above_max_tokens_is_refused():
    with pytest.raises(ValueError, match="^min_tokens"):
        SamplingParams(max_tokens=3, min_tokens=4).validate()


GOOD = [
    dict(seed=0), dict(seed=SEED_MAX), dict(seed=SEED_MIN), dict(max_tokens=MAX_INT, min_tokens=MAX_INT),
    dict(top_k=MAX_INT), dict(top_k=-1), dict(top_k=0), dict(logprobs=20, prompt_logprobs=20),
    dict(temperature=0), dict(temperature=3.4e38), dict(top_p=5e-324), dict(min_p=1.0),
    dict(repetition_penalty=1.2e-38), dict(repetition_penalty=3.4e38), dict(presence_penalty=-2, frequency_penalty=2),
    dict(stop=["x" * MAX_STOP_CHARS] * MAX_STOP_STRINGS), dict(stop="one string"), dict(stop=("a", "b")),
    dict(stop=None, stop_token_ids=None), dict(stop_token_ids=[MAX_INT] * MAX_STOP_TOKEN_IDS),
]


@pytest.mark.parametrize("kw", GOOD, ids=[str(k)[:40] for k in GOOD])
def test_boundary_values_pass(kw):
    SamplingParams(**kw).validate()
