"""merge_outputs: two consecutive outputs of a request become one."""
import pytest

from tritongen.types import RequestOutput, TokenLogprob, merge_outputs


def out(ids, text, delta_ids, delta_text, logprobs=None, finish=None, rid="r"):
    return RequestOutput(request_id=rid, prompt_token_ids=[1, 2], text=text, token_ids=ids, delta_text=delta_text,
                         delta_token_ids=delta_ids, finish_reason=finish, delta_logprobs=logprobs)


def test_merge_keeps_the_newer_state_and_joins_the_deltas():
    a = out([5], "a", [5], "a", [TokenLogprob(5, -0.1)])
    b = out([5, 6, 7], "abc", [6, 7], "bc", [TokenLogprob(6, -0.2), TokenLogprob(7, -0.3)], finish="length")
    m = merge_outputs(a, b)
    assert (m.token_ids, m.text, m.finish_reason) == ([5, 6, 7], "abc", "length")
    assert (m.delta_token_ids, m.delta_text) == ([5, 6, 7], "abc")
    assert [lp.token_id for lp in m.delta_logprobs] == [5, 6, 7]
    assert b.delta_token_ids == [6, 7]  # inputs untouched


def test_merge_without_logprobs_and_with_a_held_back_step():
    a = out([5], "", [5], "")  # text held back (e.g. half a UTF-8 character)
    b = out([5, 6], "é", [6], "é")
    m = merge_outputs(a, b)
    assert (m.delta_token_ids, m.delta_text, m.delta_logprobs) == ([5, 6], "é", None)


def test_merge_refuses_outputs_of_two_requests():
    with pytest.raises(ValueError, match="cannot merge"):
        merge_outputs(out([5], "a", [5], "a"), out([6], "b", [6], "b", rid="other"))
