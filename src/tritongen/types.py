"""Typed messages shared by every stage. Pure Python: importing this never imports torch."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal, Optional

FinishReason = Literal["stop", "length", "abort", "error"]
"""stop: EOS, a stop token or string; length: max_tokens or max_model_len; abort: cancelled by the
caller; error: the engine failed while running the request (RequestOutput.error says why)."""


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop. Names and defaults follow vLLM / the OpenAI API."""

    max_tokens: int = 16
    """Most tokens to generate."""
    temperature: float = 1.0
    """0 means greedy (argmax); higher is more random."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability sums to top_p, in (0, 1]."""
    top_k: int = -1
    """Keep the k most likely tokens; -1 or 0 keeps all."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the top token's, in [0, 1]."""
    repetition_penalty: float = 1.0
    """HF-style: divides positive (multiplies negative) logits of tokens seen in prompt or output; > 0."""
    presence_penalty: float = 0.0
    """OpenAI-style: subtracted once from logits of tokens already generated, in [-2, 2]."""
    frequency_penalty: float = 0.0
    """OpenAI-style: subtracted per occurrence from logits of tokens already generated, in [-2, 2]."""
    seed: Optional[int] = None
    """Per-request seed: the same seed gives the same output whatever else is in the batch."""
    min_tokens: int = 0
    """EOS and stop_token_ids are masked until this many tokens are generated."""
    ignore_eos: bool = False
    """Keep generating past EOS (benchmarks)."""
    stop: list[str] = field(default_factory=list)
    """Strings that end generation; they are cut from the output."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Token ids that end generation (in addition to EOS)."""
    include_stop_str_in_output: bool = False
    """Keep the matched stop string in the text."""
    logprobs: Optional[int] = None
    """Return the chosen token's logprob and this many top alternatives (0 = chosen only)."""
    prompt_logprobs: Optional[int] = None
    """Return each prompt token's logprob (given the tokens before it) and this many top alternatives.
    Such requests skip prefix-cache hits: every prompt position must go through the model."""
    skip_special_tokens: bool = True
    """Leave special tokens out of the detokenized text."""

    def __post_init__(self) -> None:
        # Normalise the shapes fronts commonly pass; anything else is left for validate() to name.
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None or isinstance(self.stop, tuple):
            self.stop = list(self.stop or [])
        if self.stop_token_ids is None or isinstance(self.stop_token_ids, tuple):
            self.stop_token_ids = list(self.stop_token_ids or [])

    @property
    def uses_penalties(self) -> bool:
        """Repetition, presence or frequency penalty: sampling reads the tokens so far."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def samples_from_host_tokens(self, num_output_tokens: int) -> bool:
        """Whether sampling the token after `num_output_tokens` outputs reads the request's tokens
        on the host: penalties count them, and min_tokens stops masking EOS exactly there. Such a
        step cannot be scheduled before the previous one's token is known."""
        return self.uses_penalties or num_output_tokens == self.min_tokens

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self, vocab_size: Optional[int] = None) -> None:
        """Raise ValueError whose message starts with the offending field's name; called before a
        request is queued. Whatever passes here must not fail the engine later (the bounds below
        are what the sampler's tensors and the per-step host work can take), so a request's own
        data can only fail that request, and at the front. With `vocab_size` (known to the engine)
        stop_token_ids must also be in the vocabulary."""
        _check_int("max_tokens", self.max_tokens, 1, MAX_INT)
        _check_int("min_tokens", self.min_tokens, 0, MAX_INT)
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        _check_int("top_k", self.top_k, -1, MAX_INT, f"-1 (disable) or an integer in [0, {MAX_INT}]")
        _check_float("temperature", self.temperature, 0.0, _F32_MAX)
        _check_float("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _check_float("min_p", self.min_p, 0.0, 1.0)
        # Divided into logits in float32: it must stay a finite non-zero float32.
        _check_float("repetition_penalty", self.repetition_penalty, _F32_TINY, _F32_MAX)
        _check_float("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_float("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        if self.seed is not None:
            _check_int("seed", self.seed, SEED_MIN, SEED_MAX, "a 64-bit integer")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 0, MAX_LOGPROBS)
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean, got {_short(getattr(self, name))}")
        self._validate_stops(vocab_size)

    def _validate_stops(self, vocab_size: Optional[int]) -> None:
        if not isinstance(self.stop, list) or len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop must be a list of at most {MAX_STOP_STRINGS} strings")
        for s in self.stop:
            if not isinstance(s, str) or not 0 < len(s) <= MAX_STOP_CHARS:
                raise ValueError(f"stop must hold non-empty strings of at most {MAX_STOP_CHARS} characters, "
                                 f"got {_short(s)}")
        if not isinstance(self.stop_token_ids, list) or len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"stop_token_ids must be a list of at most {MAX_STOP_TOKEN_IDS} token ids")
        top = MAX_INT if vocab_size is None else vocab_size - 1
        for t in self.stop_token_ids:
            _check_int("stop_token_ids", t, 0, top, f"token ids in [0, {top}]")


MAX_INT = 2 ** 31 - 1
"""Bound of the integer counts (max_tokens, min_tokens, top_k): an int32, as Triton's tensors carry them."""
SEED_MIN, SEED_MAX = -(2 ** 63), 2 ** 64 - 1
"""What torch.Generator.manual_seed takes (a negative seed s acts as s + 2**64)."""
MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024
"""Every stop string is searched for in the new text at every step, and streaming holds back up
to its length - 1 characters: these bound that work per request."""
MAX_STOP_TOKEN_IDS = 1024
_F32_MAX = 3.4028234663852886e38
_F32_TINY = 1.1754943508222875e-38  # the smallest normal float32


def _short(value: object) -> str:
    if isinstance(value, int) and value.bit_length() > 128:  # repr() of a huge int is slow or refused
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_int(name: str, value: object, low: int, high: int, what: str = "") -> None:
    """An int (not a bool) in [low, high], else ValueError starting with `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be {what or f'an integer in [{low}, {high}]'}, got {_short(value)}")


def _check_float(name: str, value: object, low: float, high: float, low_open: bool = False) -> None:
    """A real number (not a bool, not NaN or inf) in [low, high] (or (low, high]), else ValueError."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    # abs() first: an int beyond the float range would overflow the comparisons' conversion.
    ok = ok and abs(value) <= _F32_MAX * 2 and math.isfinite(value) and value <= high
    ok = ok and (low < value if low_open else low <= value)
    if not ok:
        bracket = "(" if low_open else "["
        raise ValueError(f"{name} must be a number in {bracket}{low:g}, {high:g}], got {_short(value)}")


@dataclass
class TokenLogprob:
    """Logprob of one generated token (from the raw model distribution) and the top alternatives."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)
    """(token_id, logprob) of the most likely tokens, best first; empty unless asked for."""


@dataclass
class RequestTimes:
    """Wall-clock times (time.time(), seconds) of one request inside the engine; None = not yet."""

    arrival_time: float
    """When the engine received it (add_request)."""
    first_scheduled_time: Optional[float] = None
    """The first step that scheduled it: arrival to here is its queue time."""
    first_token_time: Optional[float] = None
    last_token_time: Optional[float] = None


@dataclass
class RequestOutput:
    """State of one request after an engine step: cumulative fields plus the delta of this step."""

    request_id: str
    prompt_token_ids: list[int]
    text: str
    """Detokenized output so far (stop strings cut; held-back text not yet included while streaming)."""
    token_ids: list[int]
    """All generated token ids so far."""
    delta_text: str
    """Text that became final in this step (concatenating every delta_text gives `text`)."""
    delta_token_ids: list[int]
    finish_reason: Optional[FinishReason] = None
    prompt: Optional[str] = None
    logprobs: Optional[list[TokenLogprob]] = None
    """One entry per generated token when SamplingParams.logprobs is set."""
    delta_logprobs: Optional[list[TokenLogprob]] = None
    prompt_logprobs: Optional[list[Optional[TokenLogprob]]] = None
    """One entry per prompt token when SamplingParams.prompt_logprobs is set; the first is None
    (nothing predicts it). Complete in every output of the request."""
    cumulative_logprob: Optional[float] = None
    num_cached_tokens: int = 0
    """Prompt tokens served from the prefix cache."""
    times: Optional["RequestTimes"] = None
    """Wall-clock times of the request in the engine (arrival, first scheduled, first/last token)."""
    error: Optional[str] = None
    """Set when the request ended because of an internal error (finish_reason is then "error"):
    fronts answer INTERNAL / 500 with it."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids)


def merge_outputs(older: RequestOutput, newer: RequestOutput) -> RequestOutput:
    """One output for two consecutive steps of a request: newer's state, both steps' deltas."""
    if older.request_id != newer.request_id:
        raise ValueError(f"cannot merge outputs of {older.request_id!r} and {newer.request_id!r}")
    logprobs = None
    if older.delta_logprobs is not None or newer.delta_logprobs is not None:
        logprobs = (older.delta_logprobs or []) + (newer.delta_logprobs or [])
    return replace(newer, delta_text=older.delta_text + newer.delta_text,
                   delta_token_ids=older.delta_token_ids + newer.delta_token_ids, delta_logprobs=logprobs)


@dataclass
class ScheduledSeq:
    """One request's share of a step: feed `token_ids` at positions start_pos.. and maybe sample."""

    request_id: str
    token_ids: list[int]
    """Tokens to run through the model this step (a prompt chunk, or the last sampled token)."""
    start_pos: int
    """Position of token_ids[0] (= num_computed_tokens before this step)."""
    block_table: list[int]
    """Physical KV blocks of the request, in order; covers start_pos + len(token_ids) tokens."""
    do_sample: bool
    """True when this step reaches the end of the known tokens, so a new token is sampled."""
    params: SamplingParams
    prompt_token_ids: list[int]
    """For repetition penalty (shared reference, do not mutate)."""
    output_token_ids: list[int]
    """For penalties and min_tokens (shared reference, do not mutate)."""
    eos_token_ids: tuple[int, ...] = ()
    """Masked while fewer than params.min_tokens tokens are generated."""

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def seq_len(self) -> int:
        """Context length after this step."""
        return self.start_pos + len(self.token_ids)


@dataclass
class SchedulerOutput:
    """What the runner executes in one step."""

    seqs: list[ScheduledSeq]
    finished_request_ids: list[str] = field(default_factory=list)
    """Requests that ended since the last step: the runner drops their per-request state."""
    preempted_request_ids: list[str] = field(default_factory=list)
    previous_rows: Optional[list[int]] = None
    """Asynchronous scheduling: seqs[k] for k < len(previous_rows) decode one token that the step
    before sampled, still on the device (token_ids hold a placeholder): the runner feeds sampled
    row previous_rows[k] of that step. These seqs come first, one token each."""
    num_previous: int = 0
    """How many rows the step before sampled (what a tensor-parallel worker receives)."""

    @property
    def input_from_previous(self) -> bool:
        return bool(self.previous_rows)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.seqs)

    @property
    def is_empty(self) -> bool:
        return not self.seqs


@dataclass
class ModelOutput:
    """What the runner returns: one sampled token per ScheduledSeq with do_sample, in order."""

    sampled_token_ids: list[int]
    logprobs: Optional[list[Optional[TokenLogprob]]] = None
    """Aligned with sampled_token_ids; None entries for requests that did not ask."""
    prompt_logprobs: Optional[dict[str, list[TokenLogprob]]] = None
    """request_id -> logprobs of prompt tokens start_pos+1, start_pos+2, ... computed this step
    (one per scheduled prompt position that has a next prompt token); only requests that ask."""
