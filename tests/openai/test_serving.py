"""serving.py without HTTP or an engine: request -> SamplingParams rules, response assembly."""
import pytest

from tritongen.openai import serving
from tritongen.openai.protocol import ChatCompletionRequest, CompletionRequest
from tritongen.openai.serving import RequestError
from tritongen.types import RequestOutput, TokenLogprob


class FakeTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"<{i}>" for i in ids)


def tokenize(prompt):
    return [ord(c) for c in prompt] if isinstance(prompt, str) else list(prompt)


def jobs(**body):
    return serving.completion_jobs(CompletionRequest(**body), tokenize, max_model_len=64)


def test_openai_defaults_and_renames():
    (job,) = jobs(prompt="hi")
    p = job.params
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.logprobs, p.prompt_logprobs) == (16, 1.0, 1.0, -1, None, None)
    (job,) = jobs(prompt="hi", stop="x", top_k=0, logprobs=2, echo=True, seed=7, min_tokens=2, ignore_eos=True)
    p = job.params
    assert p.stop == ["x"] and p.top_k == -1 and p.logprobs == 2 and p.prompt_logprobs == 2
    assert (p.seed, p.min_tokens, p.ignore_eos) == (7, 2, True)


def test_prompt_forms():
    assert [j.prompt_ids for j in jobs(prompt=[5, 6])] == [[5, 6]]
    assert [j.prompt_ids for j in jobs(prompt=[[5], [6, 7]])] == [[5], [6, 7]]
    assert [j.index for j in jobs(prompt=["a", "b"])] == [0, 1]


def test_echo_with_zero_max_tokens_generates_one_hidden_token():
    (job,) = jobs(prompt="hi", echo=True, max_tokens=0, logprobs=0)
    assert job.hide_output and job.params.max_tokens == 1


@pytest.mark.parametrize("body,param", [
    (dict(prompt="hi", n=2), "n"),
    (dict(prompt="hi", best_of=3), "best_of"),
    (dict(prompt="hi", temperature=-1), "temperature"),
    (dict(prompt="hi", max_tokens=0), "max_tokens"),
    (dict(prompt="hi", logprobs=21), "logprobs"),
    (dict(prompt="hi", seed=2 ** 70), "seed"),
    (dict(prompt="hi", logit_bias={"1": 2}), "logit_bias"),
    (dict(prompt="x" * 64), "prompt"),
    (dict(prompt="x" * 60, max_tokens=5), "max_tokens"),
    (dict(prompt=[]), "prompt"),
    (dict(prompt=[[1], []]), "prompt"),
    (dict(prompt="hi", suffix="s"), "suffix"),
])
def test_bad_completion_requests_name_the_parameter(body, param):
    with pytest.raises(RequestError) as info:
        jobs(**body)
    assert info.value.status == 400 and info.value.param == param


def test_chat_max_tokens_default_and_precedence():
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}])
    assert serving.chat_params(req, 10, 64).max_tokens == 54
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], max_tokens=5, max_completion_tokens=7)
    assert serving.chat_params(req, 10, 64).max_tokens == 7
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], logprobs=True, top_logprobs=3)
    assert serving.chat_params(req, 10, 64).logprobs == 3
    with pytest.raises(RequestError, match="requires logprobs"):
        serving.chat_params(ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], top_logprobs=3), 10, 64)


def test_chat_messages_text_parts_and_developer_role():
    req = ChatCompletionRequest(messages=[
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert serving.chat_messages(req) == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"}]
    bad = ChatCompletionRequest(messages=[{"role": "user", "content": [{"type": "image_url"}]}])
    with pytest.raises(RequestError):
        serving.chat_messages(bad)


def _out(**kw):
    base = dict(request_id="r", prompt_token_ids=[1, 2], text="", token_ids=[], delta_text="", delta_token_ids=[])
    base.update(kw)
    return RequestOutput(**base)


def test_completion_echo_logprobs_layout_and_streamed_deltas_add_up():
    (job,) = jobs(prompt=[1, 2], echo=True, logprobs=1)
    text_of = serving.TokenText(FakeTokenizer())
    plp = [None, TokenLogprob(2, -1.0, [(9, -0.5)])]
    lp = [TokenLogprob(3, float("-inf"), [(9, -0.1)]), TokenLogprob(4, -2.0, [(4, -2.0)])]
    final = _out(text="<3><4>", token_ids=[3, 4], finish_reason="length", prompt_logprobs=plp, logprobs=lp)
    choice = serving.CompletionStream(job, text_of).full(final)
    assert choice.text == "<1><2><3><4>"
    assert choice.logprobs.tokens == ["<1>", "<2>", "<3>", "<4>"]
    assert choice.logprobs.token_logprobs == [None, -1.0, serving.MIN_LOGPROB, -2.0]
    assert choice.logprobs.top_logprobs[1] == {"<9>": -0.5, "<2>": -1.0}
    assert choice.logprobs.text_offset == [0, 3, 6, 9]
    stream = serving.CompletionStream(job, text_of)
    steps = [_out(text="<3>", token_ids=[3], delta_text="<3>", delta_token_ids=[3], prompt_logprobs=plp,
                  logprobs=lp[:1], delta_logprobs=lp[:1]),
             _out(text="<3><4>", token_ids=[3, 4], delta_text="<4>", delta_token_ids=[4], prompt_logprobs=plp,
                  logprobs=lp, delta_logprobs=lp[1:], finish_reason="length")]
    deltas = [stream.delta(o) for o in steps]
    assert "".join(d.text for d in deltas) == choice.text
    assert sum((d.logprobs.text_offset for d in deltas), []) == choice.logprobs.text_offset
