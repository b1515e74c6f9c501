"""Typed messages shared by every stage. Pure Python: importing this never imports torch."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal, Optional

FinishReason = Literal["stop", "length", "abort"]


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
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])

    @property
    def uses_penalties(self) -> bool:
        """Repetition, presence or frequency penalty: sampling reads the tokens so far."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        """Raise ValueError naming the offending field; called before a request is queued."""
        def bad(msg: str) -> None:
            raise ValueError(msg)

        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            bad(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            bad(f"temperature must be non-negative, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            bad(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            bad(f"top_k must be -1 (disable) or a non-negative integer, got {self.top_k}")
        if not (0.0 <= self.min_p <= 1.0):
            bad(f"min_p must be in [0, 1], got {self.min_p}")
        if not (self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty)):
            bad(f"repetition_penalty must be positive, got {self.repetition_penalty}")
        if not (-2.0 <= self.presence_penalty <= 2.0):
            bad(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not (-2.0 <= self.frequency_penalty <= 2.0):
            bad(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            bad(f"min_tokens must be non-negative, got {self.min_tokens}")
        if self.min_tokens > self.max_tokens:
            bad(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= 20):
            bad(f"logprobs must be an integer in [0, 20], got {self.logprobs}")
        if self.prompt_logprobs is not None and (
                not isinstance(self.prompt_logprobs, int) or not 0 <= self.prompt_logprobs <= 20):
            bad(f"prompt_logprobs must be an integer in [0, 20], got {self.prompt_logprobs}")
        if self.seed is not None and not isinstance(self.seed, int):
            bad(f"seed must be an integer, got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            bad("stop must be a list of non-empty strings")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids must be non-negative integers")


@dataclass
class TokenLogprob:
    """Logprob of one generated token (from the raw model distribution) and the top alternatives."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)
    """(token_id, logprob) of the most likely tokens, best first; empty unless asked for."""


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
    error: Optional[str] = None
    """Set when the request ended because of an internal error (finish_reason is then "abort")."""

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
