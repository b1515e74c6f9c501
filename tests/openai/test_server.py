"""The official openai SDK against the real server (uvicorn on a free port, tiny model)."""
import asyncio

import httpx
import pytest
import torch

from oai_helpers import MODEL

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
NO_EOS = {"ignore_eos": True}


def engine_final(engine, prompt, params):
    async def run():
        return [o async for o in engine.generate(prompt, params)][-1]
    return asyncio.run(run())


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server.url + "/health").status_code == 200


def test_completion_text_usage_and_finish_reason(client, engine):
    r = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=7, temperature=0, extra_body=NO_EOS)
    c = r.choices[0]
    assert c.finish_reason == "length" and c.text and r.object == "text_completion"
    assert r.usage.prompt_tokens == len(engine.tokenizer.encode("Hello there"))
    assert r.usage.completion_tokens == 7 and r.usage.total_tokens == r.usage.prompt_tokens + 7


def test_greedy_chat_equals_llm_generate_with_the_same_template(client, engine):
    from tritongen import LLM, SamplingParams

    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0)
    ids = list(engine.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)["input_ids"])
    llm = LLM(MODEL, dtype="float32", device="cpu", kv_cache_memory_gb=0.02)  # same seed: same dummy weights
    want = llm.generate([ids], SamplingParams(temperature=0, max_tokens=12))[0]
    assert r.choices[0].message.content == want.text and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == len(want.token_ids)


def test_streams_match_non_streaming_and_end_with_usage(client):
    kw = dict(model=MODEL, prompt="Stream me", max_tokens=10, temperature=0, extra_body=NO_EOS)
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10

    kw = dict(model=MODEL, messages=CHAT, max_tokens=10, temperature=0)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    plain = list(client.chat.completions.create(**kw, stream=True))
    assert all(c.usage is None for c in plain) and plain[-1].choices[0].finish_reason is not None


def test_raw_sse_ends_with_done(server):
    with httpx.stream("POST", server.url + "/v1/completions",
                      json={"prompt": "x", "max_tokens": 3, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"


def test_stop_strings_str_and_list(client):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=0, extra_body=NO_EOS)
    full = client.completions.create(**kw).choices[0].text
    stop = full[len(full) // 2: len(full) // 2 + 3]
    cut = full[: full.index(stop)]
    for s in (stop, [stop, "never-appears"]):
        c = client.completions.create(**kw, stop=s).choices[0]
        assert c.text == cut and c.finish_reason == "stop"


def test_seed_reproducibility(client):
    def run(seed):
        return client.completions.create(model=MODEL, prompt="Random", max_tokens=12, temperature=1.0,
                                         seed=seed, extra_body=NO_EOS).choices[0].text
    assert run(123) == run(123)
    assert run(123) != run(124)


def test_sampling_knobs_are_accepted(client):
    r = client.completions.create(model=MODEL, prompt="knobs", max_tokens=5, temperature=0.7, top_p=0.9,
                                  presence_penalty=0.5, frequency_penalty=0.5, seed=1,
                                  extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.2})
    assert r.usage.completion_tokens >= 1
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=4, temperature=0)
    assert r.usage.completion_tokens <= 4


def test_min_tokens_masks_stop_token_ids(client, engine):
    from tritongen import SamplingParams

    first = engine_final(engine, "Hello", SamplingParams(temperature=0, max_tokens=1)).token_ids[0]
    kw = dict(model=MODEL, prompt="Hello", max_tokens=8, temperature=0)
    stopped = client.completions.create(**kw, extra_body={"stop_token_ids": [first]})
    assert stopped.usage.completion_tokens == 1 and stopped.choices[0].finish_reason == "stop"
    held = client.completions.create(**kw, extra_body={"stop_token_ids": [first], "min_tokens": 3})
    assert held.usage.completion_tokens >= 3


def test_prompt_as_token_ids_and_several_prompts(client, engine):
    ids = engine.tokenizer.encode("Hello there")
    kw = dict(model=MODEL, max_tokens=5, temperature=0, extra_body=NO_EOS)
    by_text = client.completions.create(prompt="Hello there", **kw).choices[0].text
    assert client.completions.create(prompt=ids, **kw).choices[0].text == by_text
    r = client.completions.create(prompt=[ids, "Other"], **kw)
    assert [c.index for c in r.choices] == [0, 1] and r.choices[0].text == by_text
    assert r.usage.completion_tokens == 10


def test_logprobs_completion_and_chat(client, engine):
    from tritongen import SamplingParams

    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, temperature=0, logprobs=3,
                                  extra_body=NO_EOS)
    lp = r.choices[0].logprobs
    want = engine_final(engine, "Hello", SamplingParams(temperature=0, max_tokens=6, logprobs=3, ignore_eos=True))
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert lp.token_logprobs == [e.logprob for e in want.logprobs]
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert 3 <= len(top) <= 4 and max(top.values()) == chosen  # greedy picks the top token

    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, temperature=0, logprobs=True,
                                       top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content) == r.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob == t.logprob for t in content)
    assert all(bytes(t.bytes).decode() == t.token for t in content)


def test_echo_logprobs_lm_eval_style_equal_hf_log_softmax(client, engine):
    """lm-eval's loglikelihood request: token-id prompt, echo, logprobs=1, max_tokens=1 (and 0)."""
    from tritongen.models.hf_twin import hf_twin

    runner = engine.engine.runner
    hf = hf_twin(runner.model, runner.arch)
    ids = engine.tokenizer.encode("The quick brown fox jumps over the lazy dog")
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
    want = ref[:-1].gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)
    for max_tokens in (1, 0):
        r = client.completions.create(model=MODEL, prompt=[ids], max_tokens=max_tokens, temperature=0,
                                      logprobs=1, echo=True)
        lp = r.choices[0].logprobs
        n = len(ids) + max_tokens
        assert len(lp.token_logprobs) == n and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        torch.testing.assert_close(torch.tensor(lp.token_logprobs[1:len(ids)]), want, atol=1e-4, rtol=0)
        greedy = ref[:-1].argmax(-1)
        is_greedy = [max(top.values()) == tok for tok, top in zip(lp.token_logprobs[1:len(ids)],
                                                                  lp.top_logprobs[1:len(ids)])]
        assert is_greedy == (greedy == torch.tensor(ids[1:])).tolist()
        assert r.choices[0].text.startswith(engine.tokenizer.decode(ids))
        assert r.usage.completion_tokens == max_tokens


def test_echo_without_logprobs_prepends_the_prompt(client):
    r = client.completions.create(model=MODEL, prompt="Echo this", max_tokens=3, temperature=0, echo=True)
    assert r.choices[0].text.startswith("Echo this") and len(r.choices[0].text) > len("Echo this")


@pytest.mark.slow
def test_smollm2_chat_through_the_server(default_model_dir):
    import openai

    from oai_helpers import ServerThread
    from tritongen import AsyncLLM
    from tritongen.openai.server import build_app

    engine = AsyncLLM(default_model_dir, dtype="float32", device="cpu", kv_cache_memory_gb=0.1)
    srv = ServerThread(build_app(engine))  # served under the default model's name
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="-", max_retries=0)
        r = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT, max_tokens=16,
                                           temperature=0)
        assert r.choices[0].message.content.startswith("The capital of France is Paris")
    finally:
        srv.stop()
        engine.shutdown()
