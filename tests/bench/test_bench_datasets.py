"""Benchmark datasets: ShareGPT-like statistics, bounds, determinism; the other sources."""
import json
import statistics

import pytest

from tritongen.bench import datasets as ds
from tritongen.bench.corpus import CorpusTokens, corpus_lines


def test_sharegpt_like_lengths_hit_the_sharegpt_means_within_bounds():
    pairs = ds.sharegpt_like_lengths(1000, seed=0)
    prompts, outputs = [p for p, _ in pairs], [o for _, o in pairs]
    assert statistics.mean(prompts) == pytest.approx(ds.SHAREGPT_PROMPT_MEAN, rel=0.05)
    assert statistics.mean(outputs) == pytest.approx(ds.SHAREGPT_OUTPUT_MEAN, rel=0.05)
    assert min(prompts) >= 4 and min(outputs) >= 4
    assert max(prompts) <= 1024 and max(p + o for p, o in pairs) <= 2048
    assert statistics.median(prompts) < statistics.mean(prompts)  # heavy right tail, as in ShareGPT
    assert len(set(pairs)) > 900


def test_sharegpt_like_is_deterministic_in_the_seed():
    assert ds.sharegpt_like_lengths(200, seed=0) == ds.sharegpt_like_lengths(200, seed=0)
    assert ds.sharegpt_like_lengths(200, seed=0) != ds.sharegpt_like_lengths(200, seed=1)
    for seed in (1, 2):  # stratified draws keep the means close for any seed
        pairs = ds.sharegpt_like_lengths(1000, seed)
        assert statistics.mean(p for p, _ in pairs) == pytest.approx(244, rel=0.05)


def test_sharegpt_like_prompts_are_corpus_text_of_the_stated_length(tokenizer):
    reqs = ds.load_dataset("sharegpt-like", 40, 0, tokenizer)
    assert reqs == ds.load_dataset("sharegpt-like", 40, 0, tokenizer)
    for r in reqs:
        assert isinstance(r.prompt, str) and r.prompt.strip()
        assert len(tokenizer.encode(r.prompt, add_special_tokens=False)) == r.prompt_len
    wanted = [p for p, _ in ds.sharegpt_like_lengths(40, 0)]
    close = sum(abs(r.prompt_len - w) <= 2 for r, w in zip(reqs, wanted))
    assert close >= 36  # re-encoding a decoded window rarely moves its length
    assert len({r.prompt[:50] for r in reqs}) == 40


def test_corpus_windows_wrap_and_lines_are_real_text(tokenizer):
    lines = corpus_lines(min_words=3)
    assert len(lines) > 10000 and "From fairest creatures we desire increase" in lines
    tokens = CorpusTokens(tokenizer)
    text, n = tokens.text_of_length(len(tokens.ids) - 3, 10)  # crosses the end of the corpus
    assert 8 <= n <= 12 and text


def test_random_dataset_is_token_ids_without_special_tokens(tokenizer):
    reqs = ds.load_dataset("random:12:7", 5, 3, tokenizer)
    special = set(tokenizer.all_special_ids)
    assert all(len(r.prompt) == 12 == r.prompt_len and r.output_len == 7 for r in reqs)
    assert not any(t in special for r in reqs for t in r.prompt)
    assert reqs == ds.load_dataset("random:12:7", 5, 3, tokenizer)
    with pytest.raises(ValueError, match="random:IN:OUT"):
        ds.load_dataset("random:x:7", 5, 3, tokenizer)


def test_sharegpt_json_uses_vllm_sampling_rules(tmp_path, tokenizer):
    long_text = "word " * 1100
    convs = [
        {"conversations": [{"from": "human", "value": "Tell me a story about a dragon please"},
                           {"from": "gpt", "value": "Once upon a time there was a dragon who slept"}]},
        {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello there, friend!"}]},
        {"conversations": [{"from": "human", "value": long_text}, {"from": "gpt", "value": "ok ok ok ok ok"}]},
        {"conversations": [{"from": "human", "value": "only one turn here, nothing else"}]},
        {"conversations": [{"from": "human", "value": "What is two plus two, exactly?"},
                           {"from": "gpt", "value": "Two plus two is four."}]},
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(convs))
    reqs = ds.load_dataset(f"sharegpt:{path}", 2, 0, tokenizer)
    assert sorted(r.prompt for r in reqs) == ["Tell me a story about a dragon please", "What is two plus two, exactly?"]
    story = next(r for r in reqs if "dragon" in r.prompt)
    assert story.output_len == len(tokenizer.encode("Once upon a time there was a dragon who slept"))
    with pytest.raises(ValueError, match="only 2 usable"):
        ds.load_dataset(f"sharegpt:{path}", 3, 0, tokenizer)


def test_jsonl_dataset(tmp_path, tokenizer):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "Hello world", "output_len": 9}\n\n{"prompt": [5, 6, 7], "max_tokens": 3}\n')
    a, b = ds.load_dataset(f"file:{path}", 10, 0, tokenizer)
    assert (a.prompt_len, a.output_len) == (len(tokenizer.encode("Hello world")), 9)
    assert (b.prompt, b.prompt_len, b.output_len) == ([5, 6, 7], 3, 3)
    with pytest.raises(ValueError, match="unknown dataset"):
        ds.load_dataset("nope", 1, 0, tokenizer)
