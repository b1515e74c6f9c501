"""bench offline feeds token ids the model accepts, even when a dummy model's vocabulary is smaller
than the tokenizer's (Llama-2 shapes with the default model's tokenizer)."""
from types import SimpleNamespace

from tritongen.bench.datasets import BenchRequest
from tritongen.bench.offline import model_prompts


class _Tok:
    def encode(self, text):
        return [ord(c) * 10 for c in text]  # ids up to ~1200


def _llm(vocab):
    return SimpleNamespace(engine=SimpleNamespace(limits=SimpleNamespace(vocab_size=vocab)), tokenizer=_Tok())


def test_ids_are_folded_into_a_smaller_vocabulary_keeping_lengths():
    reqs = [BenchRequest("hello world", 11, 4), BenchRequest([5, 999, 7], 3, 4)]
    prompts = model_prompts(_llm(100), reqs)
    assert [len(p) for p in prompts] == [11, 3]
    assert all(0 <= t < 100 for p in prompts for t in p)


def test_ids_in_range_pass_unchanged():
    reqs = [BenchRequest("hi", 2, 4), BenchRequest([5, 6], 2, 4)]
    assert model_prompts(_llm(5000), reqs) == [[1040, 1050], [5, 6]]
