"""Incremental detokenization with the real SmolLM2 (byte-level BPE) tokenizer."""
import pytest

from tritongen.core.detokenizer import IncrementalDetokenizer
from tritongen.types import SamplingParams

TEXTS = [
    "你好，世界！今天天气很好。",
    "Emoji time: 🌍🚀👩‍👩‍👧 done",
    "naïve café — déjà vu, Ελληνικά, русский.",
    " leading space and  double  spaces\nnew line",
]


def stream(tokenizer, ids, params=SamplingParams(), prompt=(1, 2, 3)):
    d = IncrementalDetokenizer(tokenizer, list(prompt), params)
    deltas = []
    for t in ids:
        stop = d.add_tokens([t])
        deltas.append(d.take_delta(finished=stop is not None))
        if stop:
            break
    d.flush()
    deltas.append(d.take_delta(finished=True))
    return d, deltas


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_concatenate_to_text_without_replacement_chars(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    if not text.isascii():  # some character really is split across tokens
        assert any("\ufffd" in tokenizer.decode([t]) for t in ids)
    d, deltas = stream(tokenizer, ids)
    assert "".join(deltas) == d.text == tokenizer.decode(ids)
    assert d.text == text
    assert not any("\ufffd" in x for x in deltas)


def test_stop_string_across_tokens_is_cut_and_never_streamed(tokenizer):
    text = "The capital of France is Paris. It is big."
    ids = tokenizer.encode(text, add_special_tokens=False)
    d, deltas = stream(tokenizer, ids, SamplingParams(stop=["is Par"]))
    assert d.text == "The capital of France "
    assert "".join(deltas) == d.text
    d2, _ = stream(tokenizer, ids, SamplingParams(stop=["is Par"], include_stop_str_in_output=True))
    assert d2.text == "The capital of France is Par"


def test_emoji_stop_string(tokenizer):
    text = "abc 🚀 def"
    ids = tokenizer.encode(text, add_special_tokens=False)
    d, deltas = stream(tokenizer, ids, SamplingParams(stop=["🚀"]))
    assert d.text == "abc " and "".join(deltas) == "abc "


@pytest.mark.parametrize("text", TEXTS)
def test_fast_decoder_gives_the_same_stream(tokenizer, text):
    from tritongen.tokenizer import FastDecoder

    ids = tokenizer.encode(text, add_special_tokens=False)
    assert stream(FastDecoder(tokenizer), ids)[1] == stream(tokenizer, ids)[1]
