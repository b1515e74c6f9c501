"""Translation between OpenAI requests/responses and the engine's SamplingParams/RequestOutput.

Pure: no HTTP and no engine here, only a tokenizer, so every rule is unit-testable. Bad input
raises RequestError, which the server turns into an OpenAI-shaped HTTP error.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

from tritongen.openai.protocol import (
    ChatCompletionRequest, ChatLogprobs, ChatTokenLogprob, CompletionChoice, CompletionLogprobs,
    OPENAI_PARAMS, CompletionRequest, PerfMetrics, TopLogprob, Usage, _SamplingFields,
)
from tritongen.params import BY_NAME, MAX_LOGPROBS, SamplingParams
from tritongen.types import RequestOutput, TokenLogprob

PromptInput = Union[str, list[int]]
# JSON has no -inf; OpenAI-compatible servers report impossible tokens with a large negative number.
MIN_LOGPROB = -9999.0
_FALLBACK_CHARS_PER_TOKEN = 256  # for a tokenizer that cannot list its vocabulary: generous


class RequestError(Exception):
    """A client error: becomes {"error": {message, type, param, code}} with this status."""

    def __init__(self, message: str, param: Optional[str] = None, status: int = 400,
                 code: Optional[str] = None, type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.type = message, param, status, code, type


# -- requests -----------------------------------------------------------------------------------

def _reject_unsupported(req: _SamplingFields) -> None:
    if req.n not in (None, 1):
        raise RequestError("n > 1 is not supported; send n separate requests (with different seeds)", "n")
    if req.best_of not in (None, 1):
        raise RequestError("best_of > 1 is not supported", "best_of")
    if req.logit_bias:
        raise RequestError("logit_bias is not supported", "logit_bias")


def sampling_params(req: _SamplingFields, max_tokens: int, logprobs: Optional[int] = None,
                    prompt_logprobs: Optional[int] = None) -> SamplingParams:
    """SamplingParams for `req` (the table's defaults where a field is absent), validated: the one
    check of this request's parameters (the engine's own call only adds the vocabulary)."""
    _reject_unsupported(req)
    values = {p.name: p.read("openai", getattr(req, p.name)) for p in OPENAI_PARAMS}
    values.update(max_tokens=max_tokens, logprobs=logprobs, prompt_logprobs=prompt_logprobs)
    params = SamplingParams(**{k: v for k, v in values.items() if v is not None})
    try:
        params.validate()
    except ValueError as exc:
        first = str(exc).split()[0]
        raise RequestError(str(exc), first if first in BY_NAME else None) from None
    return params


def check_length(num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
    if num_prompt_tokens >= max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{num_prompt_tokens} tokens (at least one token must be left for the output)",
            "prompt", code="context_length_exceeded")
    if num_prompt_tokens + max_tokens > max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens, but {num_prompt_tokens} "
            f"prompt tokens plus max_tokens={max_tokens} make {num_prompt_tokens + max_tokens}; "
            "lower max_tokens or shorten the prompt", "max_tokens", code="context_length_exceeded")


def max_chars_per_token(tokenizer) -> int:
    """The most characters one token of `tokenizer` can stand for: its longest vocabulary entry.

    A vocabulary entry is at least as long as the text it decodes to (byte-level BPE spells each
    byte as one character, and a character is at least one byte; SentencePiece spells a space as
    one "▁"; byte-fallback entries like <0x41> are longer than their text), so a prompt of C
    characters has at least C / this many tokens. The exception is a normalizer that deletes or
    merges characters before tokenizing; none of the tokenizers we ship has one."""
    try:
        vocab = tokenizer.get_vocab()
    except (AttributeError, NotImplementedError):
        return _FALLBACK_CHARS_PER_TOKEN
    return max((len(t) for t in vocab), default=_FALLBACK_CHARS_PER_TOKEN) or 1


def check_text_size(num_chars: int, max_chars: int, max_model_len: int, param: str) -> None:
    """Refuse text that cannot fit in max_model_len tokens, by its length alone: before tokenizing
    it, which for megabytes of text takes seconds and gigabytes (issue 21, item 12)."""
    if num_chars > max_chars:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens; {num_chars} characters of "
            f"{param} make more than that whatever they say (the limit is {max_chars} characters)",
            param, code="context_length_exceeded")


def check_prompt_sizes(prompts: list[PromptInput], max_chars: int, max_model_len: int) -> None:
    for p in prompts:
        if isinstance(p, str):
            check_text_size(len(p), max_chars, max_model_len, "prompt")


def check_chat_size(req: ChatCompletionRequest, max_chars: int, max_model_len: int) -> None:
    total = 0
    for m in req.messages:
        if isinstance(m.content, str):
            total += len(m.content)
        elif m.content:
            total += sum(len(p.text or "") for p in m.content)
    check_text_size(total, max_chars, max_model_len, "messages")


def completion_prompts(prompt) -> list[PromptInput]:
    """OpenAI's prompt forms: str, [int], [str], [[int]] -> a list of prompts."""
    if isinstance(prompt, str):
        prompts: list = [prompt]
    elif prompt and all(isinstance(t, int) for t in prompt):
        prompts = [list(prompt)]
    else:
        prompts = list(prompt)
    if not prompts:
        raise RequestError("prompt is empty", "prompt")
    for p in prompts:
        if not p:
            raise RequestError("prompt is empty", "prompt")
    return prompts


@dataclass
class CompletionJob:
    """One prompt of a /v1/completions request, ready for the engine."""

    index: int
    prompt_ids: list[int]
    prompt_text: Optional[str]
    params: SamplingParams
    echo: bool = False
    logprobs: Optional[int] = None
    hide_output: bool = False
    """echo with max_tokens=0: one token is generated (the engine needs one) and not reported."""
    perf_metrics: bool = False
    """The request asked for usage.perf_metrics (return_perf_metrics)."""


def completion_jobs(req: CompletionRequest, tokenize, max_model_len: int) -> list[CompletionJob]:
    """Validate a completion request; `tokenize(prompt)` returns token ids or raises ValueError."""
    if req.suffix:
        raise RequestError("suffix is not supported", "suffix")
    max_tokens = BY_NAME["max_tokens"].default if req.max_tokens is None else req.max_tokens
    hide = req.echo and max_tokens == 0
    prompt_lps = req.logprobs if req.echo else None
    params = sampling_params(req, 1 if hide else max_tokens, req.logprobs, prompt_lps)
    if hide and req.min_tokens:
        raise RequestError("min_tokens must be 0 when max_tokens is 0", "min_tokens")
    jobs = []
    for i, prompt in enumerate(completion_prompts(req.prompt)):
        try:
            ids = tokenize(prompt)
        except ValueError as exc:
            raise RequestError(str(exc), "prompt") from None
        check_length(len(ids), params.max_tokens, max_model_len)
        jobs.append(CompletionJob(i, ids, prompt if isinstance(prompt, str) else None, params,
                                  req.echo, req.logprobs, hide, req.return_perf_metrics))
    return jobs


def chat_messages(req: ChatCompletionRequest) -> list[dict]:
    """Messages as the chat template expects them: text content only, "developer" read as "system"."""
    messages = []
    for i, m in enumerate(req.messages):
        if isinstance(m.content, list):
            if any(p.type != "text" or p.text is None for p in m.content):
                raise RequestError(f"messages[{i}]: only text content parts are supported", "messages")
            content = "".join(p.text for p in m.content)
        else:
            content = m.content or ""
        messages.append({"role": "system" if m.role == "developer" else m.role, "content": content})
    return messages


def chat_params(req: ChatCompletionRequest, num_prompt_tokens: int, max_model_len: int) -> SamplingParams:
    if req.tools:
        raise RequestError("tools are not supported", "tools")
    if req.response_format and req.response_format.get("type") not in (None, "text"):
        raise RequestError("response_format other than text is not supported", "response_format")
    if req.top_logprobs is not None and not req.logprobs:
        raise RequestError("top_logprobs requires logprobs to be true", "top_logprobs")
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_LOGPROBS:
        raise RequestError(f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {req.top_logprobs}", "top_logprobs")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    if max_tokens is None:
        max_tokens = max(max_model_len - num_prompt_tokens, 1)
    params = sampling_params(req, max_tokens, (req.top_logprobs or 0) if req.logprobs else None)
    check_length(num_prompt_tokens, params.max_tokens, max_model_len)
    return params


# -- responses ----------------------------------------------------------------------------------

class TokenText:
    """Token id -> the text OpenAI reports for it (decoded alone, special tokens kept), cached."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            if len(self._cache) < 200_000:
                self._cache[token_id] = text
        return text


def _lp(x: float) -> float:
    return x if math.isfinite(x) else MIN_LOGPROB


def usage(out: RequestOutput, hide_output: bool = False, perf: bool = False) -> Usage:
    completion = 0 if hide_output else out.num_output_tokens
    return Usage(prompt_tokens=out.num_prompt_tokens, completion_tokens=completion,
                 total_tokens=out.num_prompt_tokens + completion, perf_metrics=perf_metrics(out) if perf else None)


def perf_metrics(out: RequestOutput) -> Optional[PerfMetrics]:
    """The request's engine times (RequestOutput.times) and the durations derived from them."""
    t = out.times
    if t is None:
        return None
    since = lambda end: None if end is None else end - t.arrival_time  # noqa: E731
    tpot = None
    if t.first_token_time is not None and t.last_token_time is not None and out.num_output_tokens > 1:
        tpot = (t.last_token_time - t.first_token_time) / (out.num_output_tokens - 1)
    return PerfMetrics(arrival_time=t.arrival_time, first_scheduled_time=t.first_scheduled_time,
                       first_token_time=t.first_token_time, last_token_time=t.last_token_time,
                       queue_time=since(t.first_scheduled_time), time_to_first_token=since(t.first_token_time),
                       time_per_output_token=tpot, num_cached_tokens=out.num_cached_tokens)


def completion_logprobs(text_of: TokenText, entries: list[Optional[TokenLogprob]], token_ids: list[int],
                        offset: int) -> CompletionLogprobs:
    """Legacy completions logprobs; `entries` may start with None (the first prompt token)."""
    lp = CompletionLogprobs()
    for tid, e in zip(token_ids, entries):
        tok = text_of(tid)
        lp.tokens.append(tok)
        lp.text_offset.append(offset)
        offset += len(tok)
        lp.token_logprobs.append(None if e is None else _lp(e.logprob))
        if e is None:
            lp.top_logprobs.append(None)
        else:
            top = {text_of(t): _lp(v) for t, v in e.top}
            top.setdefault(tok, _lp(e.logprob))  # OpenAI always lists the chosen token
            lp.top_logprobs.append(top)
    return lp


def _merge(a: CompletionLogprobs, b: CompletionLogprobs) -> CompletionLogprobs:
    return CompletionLogprobs(tokens=a.tokens + b.tokens, token_logprobs=a.token_logprobs + b.token_logprobs,
                              top_logprobs=a.top_logprobs + b.top_logprobs, text_offset=a.text_offset + b.text_offset)


@dataclass
class CompletionStream:
    """Turns the RequestOutputs of one CompletionJob into choices: whole, or one delta at a time."""

    job: CompletionJob
    text_of: TokenText
    _started: bool = False
    _offset: int = 0

    def _echo_text(self) -> str:
        if self.job.prompt_text is not None:
            return self.job.prompt_text
        return self.text_of.tokenizer.decode(self.job.prompt_ids, skip_special_tokens=False)

    def _prompt_part(self, out: RequestOutput) -> tuple[str, Optional[CompletionLogprobs]]:
        text = self._echo_text() if self.job.echo else ""
        lps = None
        if self.job.logprobs is not None:
            lps = CompletionLogprobs()
            if self.job.echo:
                entries = out.prompt_logprobs or [None] * len(self.job.prompt_ids)
                lps = completion_logprobs(self.text_of, entries, self.job.prompt_ids, 0)
        return text, lps

    def full(self, out: RequestOutput) -> CompletionChoice:
        text, lps = self._prompt_part(out)
        if not self.job.hide_output:
            if lps is not None:
                offset = len(text)
                lps = _merge(lps, completion_logprobs(self.text_of, out.logprobs or [], out.token_ids, offset))
            text += out.text
        return CompletionChoice(index=self.job.index, text=text, logprobs=lps, finish_reason=out.finish_reason)

    def delta(self, out: RequestOutput) -> Optional[CompletionChoice]:
        """The next streamed choice, or None when this output adds nothing to say."""
        text, lps = "", None
        if not self._started:
            self._started = True
            text, lps = self._prompt_part(out)
            self._offset = len(text)
        if not self.job.hide_output:
            text += out.delta_text
            if self.job.logprobs is not None:
                new = completion_logprobs(self.text_of, out.delta_logprobs or [], out.delta_token_ids,
                                          self._offset)
                self._offset += sum(len(t) for t in new.tokens)
                lps = new if lps is None else _merge(lps, new)
        if not text and not out.finished and not (lps and lps.tokens):
            return None
        return CompletionChoice(index=self.job.index, text=text, logprobs=lps, finish_reason=out.finish_reason)


def chat_logprobs(text_of: TokenText, entries: list[TokenLogprob]) -> ChatLogprobs:
    content = []
    for e in entries:
        tok = text_of(e.token_id)
        top = [TopLogprob(token=(t := text_of(i)), logprob=_lp(v), bytes=list(t.encode())) for i, v in e.top]
        content.append(ChatTokenLogprob(token=tok, logprob=_lp(e.logprob), bytes=list(tok.encode()),
                                        top_logprobs=top))
    return ChatLogprobs(content=content)
