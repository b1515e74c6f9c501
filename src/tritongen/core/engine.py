"""EngineCore: step = schedule -> runner.execute -> scheduler.update -> detokenize. Pure Python.

The runner (torch side) and the tokenizer are injected, so this file is tested with fakes.
"""
from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Union

from tritongen.config import SchedulerConfig
from tritongen.core.block_manager import BlockManager
from tritongen.core.detokenizer import IncrementalDetokenizer
from tritongen.core.scheduler import Scheduler
from tritongen.core.sequence import Sequence
from tritongen.types import ModelOutput, RequestOutput, RequestTimes, SamplingParams, SchedulerOutput

logger = logging.getLogger(__name__)

Prompt = Union[str, list[int]]


class RunnerLike(Protocol):
    num_blocks: int
    block_size: int

    def execute(self, sched: SchedulerOutput) -> ModelOutput: ...


class AsyncRunnerLike(RunnerLike, Protocol):
    """A runner whose launch() returns before the device is done (`asynchronous` is True): the
    returned function waits for the step's output."""

    asynchronous: bool

    def launch(self, sched: SchedulerOutput) -> Callable[[], ModelOutput]: ...


class TokenizerLike(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True)
class EngineLimits:
    """Facts about the model the engine validates requests against."""

    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]


def tokenize(tokenizer: TokenizerLike, limits: EngineLimits, prompt: Prompt) -> list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt is empty")
        ids = list(tokenizer.encode(prompt))
    else:
        ids = list(prompt)
    if not ids:
        raise ValueError("prompt is empty (no token ids)")
    bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < limits.vocab_size]
    if bad:
        raise ValueError(f"prompt token ids out of the vocabulary [0, {limits.vocab_size}): {bad[:5]}")
    return ids


def validate(tokenizer: TokenizerLike, limits: EngineLimits, prompt: Prompt, params: SamplingParams) -> list[int]:
    """A request checked against the model's limits; returns its token ids. Raises ValueError naming
    the problem. Needs no engine state: also what a process without the engine checks with."""
    params.validate(limits.vocab_size)
    ids = tokenize(tokenizer, limits, prompt)
    if len(ids) >= limits.max_model_len:
        raise ValueError(
            f"prompt has {len(ids)} tokens, but max_model_len is {limits.max_model_len} "
            f"(the prompt must be shorter to leave room for at least one output token)")
    return ids


class EngineCore:
    def __init__(
        self,
        runner: RunnerLike,
        tokenizer: TokenizerLike,
        limits: EngineLimits,
        scheduler_config: SchedulerConfig = SchedulerConfig(),
        enable_prefix_caching: bool = True,
        decoder: Optional[TokenizerLike] = None,
    ) -> None:
        self.runner = runner
        self.tokenizer = tokenizer
        self.decoder = decoder or tokenizer
        """What the streaming detokenizers call decode() on (a faster twin of the tokenizer's)."""
        # A request must always fit in the cache on its own, or preemption could never help it.
        cache_tokens = runner.num_blocks * runner.block_size
        self.limits = EngineLimits(min(limits.max_model_len, cache_tokens), limits.vocab_size, limits.eos_token_ids)
        self.block_manager = BlockManager(runner.num_blocks, runner.block_size, enable_prefix_caching)
        self.scheduler = Scheduler(scheduler_config, self.block_manager, self.limits.max_model_len)
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._arrivals = itertools.count()
        self._pending_outputs: list[RequestOutput] = []
        self.pipelined = bool(getattr(runner, "asynchronous", False))
        """One step in flight between step() calls: the outputs of step N are detokenized and
        delivered while the device runs step N+1 (runners with an asynchronous launch)."""
        self._inflight: Optional[tuple[SchedulerOutput, Callable[[], ModelOutput], float, bool]] = None
        """The step in flight: its schedule, the call that waits for its result, when its launch
        began, whether it carries prompt tokens."""
        self._at_risk: list[SchedulerOutput] = []
        """Steps scheduled but whose results are not applied yet: an exception now fails their requests."""
        self._unemitted: list[Sequence] = []
        """Requests that got a token this step, not yet turned into outputs (pipelined mode)."""
        self.num_failed_steps = 0
        self.num_steps = 0
        self.num_prefill_steps = 0
        """Steps that carried prompt tokens (a prefill or a chunk): the decodes batched with them wait longer."""
        self.num_steps_ahead = 0
        """Steps launched by asynchronous scheduling before the step before them finished."""
        self.step_seconds = {"decode": 0.0, "prefill": 0.0}
        """Seconds from each step's start (its launch, or the step before's result if that came later)
        to its result, summed over steps without and with prompt tokens: with num_steps and
        num_prefill_steps, the mean length of each kind, which is how much prefill stretches the
        decodes batched with it."""
        self._last_result: Optional[float] = None
        self.async_scheduling = (self.pipelined and scheduler_config.async_scheduling
                                 and bool(getattr(runner, "supports_input_from_previous", False)))
        """Pipelined, and the next decode step is launched before the one in flight is done, fed
        with its sampled ids on the device (Scheduler.schedule_ahead), so the device never waits
        for the host between steady decode steps."""

    # -- requests -----------------------------------------------------------------------------

    def tokenize(self, prompt: Prompt) -> list[int]:
        return tokenize(self.tokenizer, self.limits, prompt)

    def validate(self, prompt: Prompt, params: SamplingParams) -> list[int]:
        """Check a request without touching engine state (safe from any thread); returns token ids.
        Raises ValueError naming the problem."""
        return validate(self.tokenizer, self.limits, prompt, params)

    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams,
                    prompt_text: Optional[str] = None) -> Sequence:
        """Validate and queue a request; raises ValueError naming the problem."""
        ids = self.validate(prompt, params)
        seq = Sequence(request_id, ids, params, self.limits.eos_token_ids, next(self._arrivals),
                       prompt if isinstance(prompt, str) else prompt_text)
        self.scheduler.add(seq)
        self.detokenizers[request_id] = IncrementalDetokenizer(self.decoder, ids, params)
        return seq

    def abort(self, request_id: str) -> Optional[RequestOutput]:
        """Abort now (blocks freed on return). The final output is also returned by the next step()."""
        seq = self.scheduler.abort(request_id)
        if seq is None:
            return None
        out = self._make_output(seq, finished=True)
        self._pending_outputs.append(out)
        return out

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._pending_outputs) or self._inflight is not None

    # -- the loop -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One step; returns the outputs it produced. If it raises, call fail_step(): it ends the
        requests of the step that failed and returns every output the step owed."""
        if self.pipelined:
            self._pipelined_step()
        else:
            self._sequential_step()
        outputs, self._pending_outputs = self._pending_outputs, []
        return outputs

    def _sequential_step(self) -> None:
        sched = self.scheduler.schedule()
        self._at_risk = [sched]
        if not sched.is_empty:
            prefill = self._count(sched)
            started = time.perf_counter()
            out = self.runner.execute(sched)
            self._time(prefill, started)
            self._pending_outputs += self._emit(self.scheduler.update(sched, out))
        elif sched.finished_request_ids:
            self.runner.execute(sched)  # lets the runner drop per-request state
        self._at_risk = []

    def _pipelined_step(self) -> None:
        """Wait for the step in flight, apply its tokens, launch the next step, then detokenize and
        emit while the device runs it. A stop string found here ends a request that the step in
        flight also computes; its extra token is dropped (the request is gone when it arrives)."""
        if self._inflight is not None:
            sched, result, launched, prefill = self._inflight
            self._inflight = None
            ahead = self.scheduler.schedule_ahead(sched) if self.async_scheduling else None
            if ahead is not None:
                self._launch(ahead)
            out = result()
            self._time(prefill, launched)
            self._unemitted = self.scheduler.update(sched, out)
            self._settled(sched)
            if ahead is not None:
                self._emit_unemitted()
                return
        sched = self.scheduler.schedule()
        if not sched.is_empty:
            self._launch(sched)
        elif sched.finished_request_ids:
            self._at_risk.append(sched)
            self.runner.execute(sched)  # lets the runner drop per-request state
            self._settled(sched)
        self._emit_unemitted()

    def _launch(self, sched: SchedulerOutput) -> None:
        self._at_risk.append(sched)  # first: a launch that raises fails the step's requests too
        prefill = self._count(sched)
        started = time.perf_counter()  # before the launch's host work: a device idle through it waits for it
        self._inflight = (sched, self.runner.launch(sched), started, prefill)

    def _settled(self, sched: SchedulerOutput) -> None:
        self._at_risk = [s for s in self._at_risk if s is not sched]  # identity: == would compare deeply

    def _emit_unemitted(self) -> None:
        updated, self._unemitted = self._unemitted, []
        self._pending_outputs += self._emit(updated)

    def _count(self, sched: SchedulerOutput) -> bool:
        """Count a step as it is launched; returns whether it carries prompt tokens."""
        now = time.time()
        for scheduled in sched.seqs:
            seq = self.scheduler.requests.get(scheduled.request_id)
            if seq is not None and seq.times.first_scheduled_time is None:
                seq.times.first_scheduled_time = now
        self.num_steps += 1
        self.num_steps_ahead += sched.input_from_previous
        prefill = sched.carries_prompt_tokens
        self.num_prefill_steps += prefill
        return prefill

    def _time(self, prefill: bool, started: float) -> None:
        """Count the step whose result just arrived into step_seconds."""
        now = time.perf_counter()
        begin = started if self._last_result is None else max(started, self._last_result)
        self._last_result = now
        self.step_seconds["prefill" if prefill else "decode"] += now - begin

    def _emit(self, updated: list[Sequence]) -> list[RequestOutput]:
        outputs = []
        for seq in updated:
            try:
                outputs.append(self._process(seq))
            except Exception as exc:  # one broken request must not take down the batch
                logger.exception("request %s failed", seq.request_id)
                outputs.append(self._fail(seq, exc))
        return outputs

    def fail_step(self, exc: BaseException) -> list[RequestOutput]:
        """After step() raised `exc`: end with finish_reason "error" the requests scheduled in the
        steps whose results were not applied (the one that raised, and in pipelined mode the one in
        flight beside it); their blocks are freed. Requests not scheduled there go on. Returns the
        outputs the step owed: aborts, tokens applied before the exception, and the errors."""
        self.num_failed_steps += 1
        failed = dict.fromkeys(s.request_id for sched in self._at_risk for s in sched.seqs)
        for sched in self._at_risk:  # the runner may not have dropped their state: tell it again
            self.scheduler.requeue_finished(sched.finished_request_ids)
        self._at_risk, self._inflight = [], None
        updated, self._unemitted = self._unemitted, []
        outputs, self._pending_outputs = self._pending_outputs, []
        outputs += self._emit([seq for seq in updated if seq.request_id not in failed])
        seqs = [self.scheduler.requests[rid] for rid in failed if rid in self.scheduler.requests]
        return outputs + [self._fail(seq, exc) for seq in seqs]

    def fail_all(self, exc: BaseException) -> list[RequestOutput]:
        """End every request with an error (finish_reason "error"); the engine stays usable."""
        self._inflight, self._at_risk, self._unemitted = None, [], []
        outputs, self._pending_outputs = self._pending_outputs, []
        seqs = list(self.scheduler.requests.values())
        return outputs + [self._fail(seq, exc) for seq in seqs]

    def _fail(self, seq: Sequence, exc: BaseException) -> RequestOutput:
        self.scheduler.finish(seq, "error")
        self.detokenizers.pop(seq.request_id, None)
        return RequestOutput(
            request_id=seq.request_id, prompt_token_ids=seq.prompt_token_ids, prompt=seq.prompt,
            text="", token_ids=list(seq.output_token_ids), delta_text="", delta_token_ids=[],
            finish_reason="error", error=f"{type(exc).__name__}: {exc}")

    def _process(self, seq: Sequence) -> RequestOutput:
        detok = self.detokenizers[seq.request_id]
        stop = detok.add_tokens(seq.output_token_ids[-1:])
        if stop is not None and not seq.is_finished:
            self.scheduler.finish(seq, "stop")
        return self._make_output(seq, finished=seq.is_finished)

    def _make_output(self, seq: Sequence, finished: bool) -> RequestOutput:
        detok = self.detokenizers[seq.request_id]
        if finished:
            detok.flush()
            del self.detokenizers[seq.request_id]
        prev_tokens, seq.num_reported_tokens = seq.num_reported_tokens, seq.num_output_tokens
        if seq.num_output_tokens > prev_tokens:
            now = time.time()
            seq.times.first_token_time = seq.times.first_token_time or now
            seq.times.last_token_time = now
        delta_text = detok.take_delta(finished)
        t = seq.times  # copied: an output keeps the times of its step
        return RequestOutput(
            request_id=seq.request_id,
            prompt_token_ids=seq.prompt_token_ids,
            prompt=seq.prompt,
            text=detok.emitted_text,
            token_ids=list(seq.output_token_ids),
            delta_text=delta_text,
            delta_token_ids=seq.output_token_ids[prev_tokens:],
            finish_reason=seq.finish_reason,
            logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
            delta_logprobs=seq.logprobs[prev_tokens:] if seq.logprobs is not None else None,
            cumulative_logprob=seq.cumulative_logprob if seq.logprobs is not None else None,
            prompt_logprobs=list(seq.prompt_logprobs) if seq.prompt_logprobs is not None else None,
            num_cached_tokens=seq.num_cached_tokens,
            times=RequestTimes(t.arrival_time, t.first_scheduled_time, t.first_token_time, t.last_token_time),
        )

    def shutdown(self) -> None:
        """Let the runner release what it holds beyond memory (tensor-parallel worker processes)."""
        stop = getattr(self.runner, "shutdown", None)
        if stop is not None:
            stop()

    def stats(self) -> dict:
        bm = self.block_manager
        return {
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "kv_blocks_total": bm.num_blocks,
            "kv_blocks_free": bm.num_free_blocks,
            "block_size": bm.block_size,  # with kv_blocks_total: the cache_config_info metrics
            "enable_prefix_caching": bm.enable_prefix_caching,
            "kv_cache_usage": bm.usage,
            "prefix_cache_hit_rate": bm.prefix_cache_hit_rate,
            "num_preemptions": self.scheduler.num_preemptions,
            "num_steps": self.num_steps,
            "num_prefill_steps": self.num_prefill_steps,
            "num_steps_ahead": self.num_steps_ahead,
            "num_failed_steps": self.num_failed_steps,
            "decode_step_seconds": self.step_seconds["decode"],
            "prefill_step_seconds": self.step_seconds["prefill"],
            "num_mixed_graph_steps": getattr(self.runner, "mixed_graph_steps", 0),
        }
