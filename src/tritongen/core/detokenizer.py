"""Incremental, UTF-8-safe detokenization with stop strings. Pure Python (tokenizer injected).

Decoding tokens one by one breaks in two ways: a multi-byte character spread over several
byte-level tokens decodes to U+FFFD until its last byte arrives, and SentencePiece-style
tokenizers drop the leading space of a lone token. So we decode a window that starts a few
tokens back (prefix_offset) and emit only what grew past the previous window's text, and only
once it no longer ends in U+FFFD.
"""
from __future__ import annotations

from typing import Optional, Protocol

from tritongen.types import SamplingParams

# Prompt tokens kept as left context so the first output token decodes with its leading space.
_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"


class TokenizerLike(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: TokenizerLike, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = params.skip_special_tokens
        self.stop = params.stop
        self.include_stop = params.include_stop_str_in_output
        # While a stop string could still be forming, its first len-1 characters are held back.
        self.hold_back = max((len(s) for s in self.stop), default=1) - 1
        context = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.ids = context
        self.prefix_offset = 0
        self.read_offset = len(context)
        self.text = ""
        """All decoded output text (stop string cut once found)."""
        self.num_emitted = 0
        """Characters of text already handed out as deltas."""
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add_tokens(self, token_ids: list[int]) -> Optional[str]:
        """Feed new tokens; returns the stop string if one was found (text is then cut)."""
        if self.stopped:
            return None
        self.ids.extend(token_ids)
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset:])
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT):
            return None  # incomplete character (or nothing visible yet): wait for more tokens
        delta = new_text[len(prefix_text):]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return self._append(delta)

    def _append(self, delta: str) -> Optional[str]:
        old_len = len(self.text)
        self.text += delta
        if not self.stop:
            return None
        # A stop string may straddle the old text and the delta.
        search_from = max(0, old_len - self.hold_back)
        best: Optional[tuple[int, str]] = None
        for s in self.stop:
            i = self.text.find(s, search_from)
            if i != -1 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        i, s = best
        self.text = self.text[: i + len(s)] if self.include_stop else self.text[:i]
        self.stopped = True
        return s

    def flush(self) -> None:
        """At the end of a request: surface text still waiting for bytes that will never come."""
        if self.stopped or self.read_offset == len(self.ids):
            return
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset:])
        if len(new_text) > len(prefix_text):
            self.read_offset = len(self.ids)
            self._append(new_text[len(prefix_text):])

    def take_delta(self, finished: bool) -> str:
        """Text that is final now; everything once finished."""
        end = len(self.text) if (finished or self.stopped) else max(self.num_emitted, len(self.text) - self.hold_back)
        delta = self.text[self.num_emitted:end]
        self.num_emitted = end
        return delta

    @property
    def emitted_text(self) -> str:
        return self.text[: self.num_emitted]
