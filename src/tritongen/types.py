"""Typed messages shared by every stage. Pure Python: importing this never imports torch."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal, Optional

from tritongen.params import (MAX_INT, MAX_LOGPROBS, MAX_STOP_CHARS, MAX_STOP_STRINGS,  # noqa: F401 (re-exported)
                              MAX_STOP_TOKEN_IDS, SEED_MAX, SEED_MIN, SamplingParams)

FinishReason = Literal["stop", "length", "abort", "error"]
"""stop: EOS, a stop token or string; length: max_tokens or max_model_len; abort: cancelled by the
caller; error: the engine failed while running the request (RequestOutput.error says why)."""


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
    def carries_prompt_tokens(self) -> bool:
        """The step computes prompt tokens: a sequence with more than one new token (a prefill or a
        chunk of one), or one whose token samples nothing (a chunk that ends before its prompt does)."""
        return any(s.num_new_tokens > 1 or not s.do_sample for s in self.seqs)

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
