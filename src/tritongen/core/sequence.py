"""Per-request state owned by the scheduler. Pure Python."""
from __future__ import annotations

import enum
import time
from typing import Optional

from tritongen.types import FinishReason, RequestTimes, SamplingParams, TokenLogprob


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """A request as the scheduler sees it: tokens, how many have KV in the cache, and its blocks.

    Invariant: the KV of tokens [0, num_computed_tokens) is in the blocks of block_table.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        eos_token_ids: tuple[int, ...] = (),
        arrival: int = 0,
        prompt: Optional[str] = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.params = params
        self.eos_token_ids = eos_token_ids
        self.arrival = arrival
        self.prompt = prompt
        self.status = SeqStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.num_cached_tokens = 0
        """Prompt tokens found in the prefix cache when first scheduled."""
        self.times = RequestTimes(arrival_time=time.time())
        """Wall-clock times (time.time()) of this request's arrival, first scheduling and tokens."""
        self.num_registered_blocks = 0
        """Full blocks of block_table already published to the prefix cache."""
        self.block_hashes: list[int] = []
        """Content hashes of full token blocks, a pure function of the tokens (kept across preemption)."""
        self.num_preemptions = 0
        self.num_reported_tokens = 0
        """Output tokens already handed out in a RequestOutput (for deltas)."""
        self.finish_reason: Optional[FinishReason] = None
        self.logprobs: Optional[list[TokenLogprob]] = [] if params.logprobs is not None else None
        self.cumulative_logprob = 0.0
        self.prompt_logprobs: Optional[list[Optional[TokenLogprob]]] = (
            [None] if params.prompt_logprobs is not None else None)
        """Logprob of prompt token i at index i (none for token 0); filled as prefill chunks run."""

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def token_slice(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output without building the whole list."""
        n_prompt = len(self.prompt_token_ids)
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt:end - n_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - n_prompt]

    def append_token(self, token_id: int, logprob: Optional[TokenLogprob]) -> None:
        self.output_token_ids.append(token_id)
        if logprob is not None:
            self.cumulative_logprob += logprob.logprob
            if self.logprobs is not None:
                self.logprobs.append(logprob)

    def add_prompt_logprobs(self, start_pos: int, logprobs: list[TokenLogprob]) -> None:
        """Record prompt logprobs for tokens start_pos+1..; positions already known (a prefill
        recomputed after preemption) are skipped."""
        if self.prompt_logprobs is None:
            return
        skip = len(self.prompt_logprobs) - (start_pos + 1)
        if 0 <= skip < len(logprobs):
            self.prompt_logprobs.extend(logprobs[skip:])

    def reset_for_recompute(self) -> None:
        """Preemption by recompute: drop the KV; prompt + output so far are prefilled again later."""
        self.status = SeqStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table = []
        self.num_registered_blocks = 0
        self.num_preemptions += 1

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})")
