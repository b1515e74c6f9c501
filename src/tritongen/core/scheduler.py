"""Continuous batching with a token budget, chunked prefill and preemption by recompute. Pure Python.

One step mixes decodes and (chunks of) prefills. Every request simply has tokens whose KV is
not yet computed (a whole prompt, a prompt chunk, or the one token sampled last step); the
scheduler hands out the step's token budget, running requests first in arrival order, then
waiting requests strictly first-come first-served so nobody starves. When blocks run out the
newest running request is preempted (its blocks freed, recomputed later), so the oldest always
progresses.
"""
from __future__ import annotations

from collections import deque
from typing import Optional

from tritongen.config import SchedulerConfig
from tritongen.core.block_manager import BlockManager
from tritongen.core.sequence import Sequence, SeqStatus
from tritongen.types import FinishReason, ModelOutput, ScheduledSeq, SchedulerOutput


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, max_model_len: int) -> None:
        self.config = config
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.requests: dict[str, Sequence] = {}
        self._finished_ids: list[str] = []
        self.num_preemptions = 0

    # -- queue management ---------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        if seq.request_id in self.requests:
            raise ValueError(f"request_id {seq.request_id!r} is already in use")
        self.requests[seq.request_id] = seq
        self.waiting.append(seq)

    def abort(self, request_id: str) -> Optional[Sequence]:
        """Finish a request at once with reason "abort"; its blocks are free on return."""
        seq = self.requests.get(request_id)
        if seq is None:
            return None
        self.finish(seq, "abort")
        return seq

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        if seq.is_finished:
            return
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        self.block_manager.free_seq(seq)
        self.requests.pop(seq.request_id, None)
        self._finished_ids.append(seq.request_id)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def requeue_finished(self, request_ids: list[str]) -> None:
        """Report these ended requests to the runner again with the next step (the step that
        carried them failed, so the runner may still hold their state)."""
        self._finished_ids[:0] = [rid for rid in request_ids if rid not in self._finished_ids]

    # -- one step -----------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[Sequence, int]] = []
        preempted: list[Sequence] = []
        budget = self._schedule_running(budget, scheduled, preempted)
        if not preempted:
            self._schedule_waiting(budget, scheduled)
        out = SchedulerOutput(
            seqs=[self._to_scheduled(seq, n) for seq, n in scheduled],
            finished_request_ids=self._finished_ids,
            preempted_request_ids=[s.request_id for s in preempted],
        )
        self._finished_ids = []
        return out

    def schedule_ahead(self, prev: SchedulerOutput) -> Optional[SchedulerOutput]:
        """The next step while `prev` still runs on the device (asynchronous scheduling). Every
        running request decodes the token that `prev` is sampling; the runner takes it from the
        device (`previous_rows`; the host only knows its position). Requests that `prev` ends by
        length are left out, waiting requests are admitted with the budget left. A request that
        `prev` ends with EOS or a stop token computes one token that update() drops.

        None (the caller waits for `prev`, then schedule() runs) when the next step depends on
        `prev`'s tokens on the host: a running request that `prev` does not sample (a prefill
        chunk) or whose sampling reads its tokens on the host
        (SamplingParams.samples_from_host_tokens: the host count is one short while `prev` runs),
        or no free block for a decode."""
        sampled = {s.request_id: k for k, s in enumerate(s for s in prev.seqs if s.do_sample)}
        positions = {s.request_id: s.seq_len for s in prev.seqs}
        decode: list[tuple[Sequence, int]] = []
        for seq in self.running:
            k = sampled.get(seq.request_id)
            if k is None:
                return None
            p = seq.params
            after = seq.num_output_tokens + 1  # output tokens once prev's token is appended
            if after >= p.max_tokens or positions[seq.request_id] + 1 >= self.max_model_len:
                continue  # prev ends it by length
            if p.samples_from_host_tokens(after):
                return None
            decode.append((seq, k))
        budget = self.config.max_num_batched_tokens - len(decode)
        if budget < 0:
            return None
        for seq, _ in decode:  # the slot of the token prev samples
            if not self.block_manager.allocate_slots(seq, positions[seq.request_id] + 1 - seq.num_computed_tokens):
                return None  # blocks taken so far serve the next step all the same
        admitted: list[tuple[Sequence, int]] = []
        self._schedule_waiting(budget, admitted)
        if not decode and not admitted:
            return None
        seqs = [ScheduledSeq(request_id=seq.request_id, token_ids=[0], start_pos=positions[seq.request_id],
                             block_table=list(seq.block_table), do_sample=True, params=seq.params,
                             prompt_token_ids=seq.prompt_token_ids, output_token_ids=seq.output_token_ids,
                             eos_token_ids=seq.eos_token_ids)
                for seq, _ in decode]
        out = SchedulerOutput(seqs=seqs + [self._to_scheduled(seq, n) for seq, n in admitted],
                              finished_request_ids=self._finished_ids,
                              previous_rows=[k for _, k in decode] or None, num_previous=len(sampled))
        self._finished_ids = []
        return out

    def _schedule_running(self, budget: int, scheduled: list, preempted: list) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.block_manager.allocate_slots(seq, num_new):
                victim = self.running.pop()  # newest first
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    return budget
            scheduled.append((seq, num_new))
            budget -= num_new
            i += 1
        return budget

    def _schedule_waiting(self, budget: int, scheduled: list) -> None:
        bm = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            # Prompt logprobs need every prompt position through the model: no prefix-cache hits.
            computed = bm.get_computed_blocks(seq) if seq.params.prompt_logprobs is None else []
            num_cached = len(computed) * bm.block_size
            num_new = min(seq.num_tokens - num_cached, budget)
            if not bm.allocate_slots(seq, num_new, computed):
                break  # strict FCFS: never let a later request overtake the head of the queue
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = num_cached
            seq.num_computed_tokens = num_cached
            seq.status = SeqStatus.RUNNING
            self.waiting.popleft()
            self.running.append(seq)
            scheduled.append((seq, num_new))
            budget -= num_new

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free_seq(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _to_scheduled(self, seq: Sequence, num_new: int) -> ScheduledSeq:
        start = seq.num_computed_tokens
        return ScheduledSeq(
            request_id=seq.request_id,
            token_ids=seq.token_slice(start, start + num_new),
            start_pos=start,
            block_table=list(seq.block_table),
            do_sample=start + num_new == seq.num_tokens,
            params=seq.params,
            prompt_token_ids=seq.prompt_token_ids,
            output_token_ids=seq.output_token_ids,
            eos_token_ids=seq.eos_token_ids,
        )

    def update(self, sched: SchedulerOutput, model_out: ModelOutput) -> list[Sequence]:
        """Advance computed tokens, append sampled tokens, finish requests that hit a stop.

        Returns the sequences that received a token this step (finished ones included).
        """
        updated: list[Sequence] = []
        k = 0
        prompt_lps = model_out.prompt_logprobs or {}
        for s in sched.seqs:
            if s.request_id in prompt_lps and s.request_id in self.requests:
                self.requests[s.request_id].add_prompt_logprobs(s.start_pos, prompt_lps[s.request_id])
            if not s.do_sample:
                seq = self.requests.get(s.request_id)
                if seq is not None:
                    seq.num_computed_tokens += s.num_new_tokens
                    self.block_manager.cache_full_blocks(seq)
                continue
            token = model_out.sampled_token_ids[k]
            logprob = model_out.logprobs[k] if model_out.logprobs else None
            k += 1
            seq = self.requests.get(s.request_id)
            if seq is None:  # aborted while the step ran
                continue
            seq.num_computed_tokens += s.num_new_tokens
            self.block_manager.cache_full_blocks(seq)
            seq.append_token(token, logprob)
            reason = self._check_stop(seq, token)
            if reason is not None:
                self.finish(seq, reason)
            updated.append(seq)
        return updated

    def _check_stop(self, seq: Sequence, token: int) -> Optional[FinishReason]:
        p = seq.params
        if seq.num_output_tokens >= p.min_tokens:
            if not p.ignore_eos and token in seq.eos_token_ids:
                return "stop"
            if token in p.stop_token_ids:
                return "stop"
        if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None
