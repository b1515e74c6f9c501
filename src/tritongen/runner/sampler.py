"""Batched token sampling: one vectorized pass per step over every sequence that samples.

Per row, in order: raw logprobs (if asked) -> min_tokens mask -> repetition / presence / frequency
penalties -> greedy argmax, or temperature -> top_k / top_p (one sort) -> min_p -> exponential race.

The random choice is the "exponential race" argmax(probs / q) with q ~ Exp(1), which picks token i
with probability probs[i]. A seeded request draws its q from its own generator, exactly one vector of
V variates per step, so its tokens do not depend on which other requests share the batch.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from typing import Optional

import torch

from tritongen.types import SamplingParams, ScheduledSeq, TokenLogprob

SampleResult = tuple[list[int], list[Optional[TokenLogprob]]]


def _min_tokens_active(seq: ScheduledSeq) -> bool:
    return len(seq.output_token_ids) < seq.params.min_tokens


class Sampler:
    """Samples one token per row of a [N, V] logits batch; keeps per-request seeded generators."""

    def __init__(self, vocab_size: int, device: torch.device, seed: int = 0):
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self._generator = torch.Generator(device=self.device)
        self._generator.manual_seed(seed)
        # request_id -> generator of a request with SamplingParams.seed; lives until drop().
        self._seeded_generators: dict[str, torch.Generator] = {}
        self.last_token_ids: Optional[torch.Tensor] = None
        """The ids of the latest sample_async, on the device (what an asynchronous step feeds)."""

    def drop(self, request_ids: Iterable[str]) -> None:
        """Forget per-request state (seeded generators) of finished requests."""
        for request_id in request_ids:
            self._seeded_generators.pop(request_id, None)

    def sample(
        self, logits: torch.Tensor, seqs: list[ScheduledSeq]
    ) -> tuple[list[int], list[Optional[TokenLogprob]]]:
        """logits: [N, V] float32, one row per seq (only seqs with do_sample=True are passed, in order)."""
        return self.sample_async(logits, seqs)()

    def sample_async(self, logits: torch.Tensor, seqs: list[ScheduledSeq]) -> Callable[[], SampleResult]:
        """Queue the sampling on the logits' device and start copying the result to the host; the
        returned function waits for that copy (the step's only synchronisation) and unpacks it."""
        n = len(seqs)
        if n == 0:
            return lambda: ([], [])
        assert logits.dim() == 2 and logits.shape[0] == n, (tuple(logits.shape), n)
        # Columns past vocab_size (an embedding padded for alignment) are never valid tokens.
        logits = logits[:, : self.vocab_size].float()
        params = [s.params for s in seqs]
        lp_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        raw = logits  # logprobs come from the unmodified distribution, as vLLM returns them

        min_tok_rows = [i for i, s in enumerate(seqs) if _min_tokens_active(s)]
        pen_rows = [i for i, p in enumerate(params) if p.uses_penalties]
        if min_tok_rows or pen_rows:
            logits = logits.clone()
            if min_tok_rows:
                self._mask_stop_tokens(logits, seqs, min_tok_rows)
            if pen_rows:
                self._apply_penalties(logits, seqs, pen_rows)

        sample_rows = [i for i, p in enumerate(params) if not p.greedy]
        if len(sample_rows) == n:
            token_ids = self._sample_rows(logits, [seqs[i] for i in sample_rows])
        else:
            token_ids = logits.argmax(dim=-1)
            if sample_rows:
                idx = _h2d(sample_rows, logits.device)
                sampled = self._sample_rows(logits[idx], [seqs[i] for i in sample_rows])
                token_ids.index_copy_(0, idx, sampled)

        self.last_token_ids = token_ids
        if not lp_rows:
            ready = _to_host(token_ids)
            return lambda: (ready().tolist(), [None] * n)
        return self._to_host_with_logprobs(raw, token_ids, params, lp_rows)

    # ---------------------------------------------------------------- logits processing

    def _mask_stop_tokens(self, logits: torch.Tensor, seqs: list[ScheduledSeq], rows: list[int]) -> None:
        """min_tokens: EOS and stop_token_ids cannot be sampled yet (in place)."""
        vocab = logits.shape[1]
        pairs = []
        for i in rows:
            stop_ids = set(seqs[i].eos_token_ids) | set(seqs[i].params.stop_token_ids)
            pairs.extend((i, t) for t in stop_ids if 0 <= t < vocab)
        if pairs:
            index = _h2d(pairs, logits.device).t()
            # A device scalar: `logits[i, j] = -inf` would upload the value from pageable memory.
            logits.index_put_((index[0], index[1]), torch.full((), -math.inf, device=logits.device))

    def _apply_penalties(self, logits: torch.Tensor, seqs: list[ScheduledSeq], rows: list[int]) -> None:
        """HF repetition penalty over prompt+output, OpenAI presence/frequency over output (in place)."""
        device = logits.device
        params = [seqs[i].params for i in rows]
        idx = _h2d(rows, device)
        sub = logits[idx]
        factors = _h2d([[p.repetition_penalty, p.presence_penalty, p.frequency_penalty] for p in params],
                       device, torch.float32)
        rep, presence, frequency = (factors[:, j : j + 1] for j in range(3))
        output_counts = self._token_counts([seqs[i].output_token_ids for i in rows], sub.shape[1], device)
        if any(p.repetition_penalty != 1.0 for p in params):
            # Rows without a repetition penalty contribute no prompt tokens (nothing to upload).
            prompts = [seqs[i].prompt_token_ids if p.repetition_penalty != 1.0 else []
                       for i, p in zip(rows, params)]
            seen = (self._token_counts(prompts, sub.shape[1], device) > 0) | (output_counts > 0)
            sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
        sub = sub - presence * (output_counts > 0) - frequency * output_counts
        logits[idx] = sub

    @staticmethod
    def _token_counts(token_lists: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
        """[M, vocab] float32 occurrence counts, built on the device with one scatter_add."""
        counts = torch.zeros(len(token_lists) * vocab, dtype=torch.float32, device=device)
        lengths = [len(t) for t in token_lists]
        if sum(lengths) == 0:
            return counts.view(len(token_lists), vocab)
        tokens = _h2d(list(itertools.chain.from_iterable(token_lists)), device, torch.int64)
        row_of = torch.repeat_interleave(  # output_size known on the host: no sync to size the output
            torch.arange(len(token_lists), device=device), _h2d(lengths, device, torch.int64),
            output_size=sum(lengths))
        # Out-of-range ids (a prompt token beyond a truncated vocab) must not spill into the next row.
        in_range = (tokens < vocab).float()
        counts.scatter_add_(0, row_of * vocab + tokens.clamp_max(vocab - 1), in_range)
        return counts.view(len(token_lists), vocab)

    # ---------------------------------------------------------------- random choice

    def _sample_rows(self, logits: torch.Tensor, seqs: list[ScheduledSeq]) -> torch.Tensor:
        """Temperature, top_k/top_p/min_p filtering and the exponential race for non-greedy rows."""
        params = [s.params for s in seqs]
        vocab = logits.shape[1]
        use_top_k = any(0 < p.top_k < vocab for p in params)
        use_top_p = any(p.top_p < 1.0 for p in params)
        use_min_p = any(p.min_p > 0.0 for p in params)
        knobs = _h2d(
            # A temperature below 1e-5 is as good as greedy; the floor keeps logits / T finite.
            [[max(p.temperature, 1e-5),
              p.top_k if 0 < p.top_k < vocab else vocab,
              # inf: rounding in cumsum never drops a token. The floor: a top_p that float32
              # rounds to 0 would drop the top token too (its mass before is exactly 0).
              max(p.top_p, 1e-30) if p.top_p < 1.0 else math.inf,
              p.min_p] for p in params],
            logits.device, torch.float32)
        if any(p.temperature != 1.0 for p in params):
            logits = logits / knobs[:, 0:1]
        if use_top_k or use_top_p:
            logits = _top_k_top_p(logits, knobs[:, 1].long(), knobs[:, 2], use_top_p)
        probs = logits.softmax(dim=-1)
        if use_min_p:
            # min_p compares ratios to the top token, so it is unaffected by the renormalization
            # that top_k/top_p imply; dropping tokens needs no renormalization for the race either.
            threshold = knobs[:, 3:4] * probs.amax(dim=-1, keepdim=True)
            probs = probs.masked_fill(probs < threshold, 0.0)
        q = self._exponentials(seqs, probs.shape, probs.device)
        return (probs / q).argmax(dim=-1)

    def _exponentials(
        self, seqs: list[ScheduledSeq], shape: torch.Size, device: torch.device
    ) -> torch.Tensor:
        """Exp(1) variates: one V-vector per seeded row from its own generator, the rest in one draw."""
        q = torch.empty(shape, dtype=torch.float32, device=device)
        seeded = [i for i, s in enumerate(seqs) if s.params.seed is not None]
        if not seeded:
            q.exponential_(generator=self._generator)
        else:
            unseeded = [i for i, s in enumerate(seqs) if s.params.seed is None]
            if unseeded:
                idx = _h2d(unseeded, device)
                q[idx] = torch.empty(len(unseeded), shape[1], device=device).exponential_(
                    generator=self._generator)
            for i in seeded:
                q[i].exponential_(generator=self._seeded_generator(seqs[i], device))
        # An exact 0 would turn probs/q into inf (or nan for dropped tokens, which argmax prefers).
        return q.clamp_min_(torch.finfo(torch.float32).tiny)

    def _seeded_generator(self, seq: ScheduledSeq, device: torch.device) -> torch.Generator:
        gen = self._seeded_generators.get(seq.request_id)
        if gen is None:
            gen = torch.Generator(device=device)
            gen.manual_seed(seq.params.seed % 2 ** 64)  # validate() allows [-2**63, 2**64 - 1]
            self._seeded_generators[seq.request_id] = gen
        return gen

    # ---------------------------------------------------------------- device -> host

    @staticmethod
    def _to_host_with_logprobs(
        raw: torch.Tensor, token_ids: torch.Tensor, params: list[SamplingParams], lp_rows: list[int]
    ) -> Callable[[], SampleResult]:
        """Ids, chosen logprobs and top lists packed into one float64 tensor: one transfer."""
        n, vocab = raw.shape
        idx = _h2d(lp_rows, raw.device) if len(lp_rows) < n else None
        rows = raw if idx is None else raw[idx]
        chosen_ids = token_ids if idx is None else token_ids[idx]
        logprobs = torch.log_softmax(rows, dim=-1)  # float32, like HF's log_softmax
        k = min(max(params[i].logprobs for i in lp_rows), vocab)
        parts = [logprobs.gather(1, chosen_ids.unsqueeze(1)).double()]
        if k > 0:
            top_lp, top_ids = logprobs.topk(k, dim=-1)  # sorted, best first
            parts += [top_lp.double(), top_ids.double()]  # ids < 2**53 are exact in float64
        block = torch.cat(parts, dim=1)
        ready = _to_host(torch.cat([token_ids.double(), block.flatten()]))
        return lambda: _unpack_logprobs(ready().tolist(), n, k, params, lp_rows)


def _h2d(data: list, device: torch.device, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """A small host list on `device` without stalling the host: a copy from pageable memory waits
    for the stream to drain (the whole forward pass in flight), one from pinned memory does not.
    Measured on the H200: the min_tokens mask's pageable copy held every step's host 4.7 ms."""
    t = torch.tensor(data, dtype=dtype)
    if torch.device(device).type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def _to_host(t: torch.Tensor) -> Callable[[], torch.Tensor]:
    """Start a non-blocking device-to-host copy into pinned memory; the function waits for it."""
    if t.device.type != "cuda":
        return lambda: t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    done = torch.cuda.Event()
    done.record()

    def wait() -> torch.Tensor:
        done.synchronize()
        return host

    return wait


def _unpack_logprobs(flat: list[float], n: int, k: int, params: list[SamplingParams],
                     lp_rows: list[int]) -> SampleResult:
    ids = [int(t) for t in flat[:n]]
    out: list[Optional[TokenLogprob]] = [None] * n
    width = 1 + 2 * k if k > 0 else 1
    for j, i in enumerate(lp_rows):
        row = flat[n + j * width : n + (j + 1) * width]
        num_top = min(params[i].logprobs, k)
        top = [(int(row[1 + k + t]), row[1 + t]) for t in range(num_top)]
        out[i] = TokenLogprob(token_id=ids[i], logprob=row[0], top=top)
    return ids, out


def _top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, use_top_p: bool
) -> torch.Tensor:
    """Set to -inf every token outside each row's top_k, then outside its top_p nucleus; one sort.

    top_k: [N] long (vocab = off); top_p: [N] float (inf = off). Top-p is taken over the
    distribution renormalized after top_k, and always keeps the most likely token.
    """
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[1], device=logits.device)
    drop = ranks.unsqueeze(0) >= top_k.unsqueeze(1)
    if use_top_p:
        probs = sorted_logits.masked_fill(drop, -math.inf).softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop |= mass_before >= top_p.unsqueeze(1)
    # sorted_idx is a permutation of each row, so this scatter writes every entry.
    drop = drop.scatter(1, sorted_idx, drop)
    return logits.masked_fill(drop, -math.inf)
