"""CUDA graphs for mixed steps: prompt tokens beside decode rows, one graph per token bucket.

A step that carries a prompt runs eagerly unless captured: ~380 launches of a 7B model from Python.
In serving at concurrency 128 such steps are a fifth of all and a third of the time, and their
launch alone took 36 ms of host time on an H100 machine with a slow host, twice the GPU's work. Here
the flat batch is laid out as the eager step lays it out (runner/step_layout.py: sequences in
order, their tokens concatenated) and padded: tokens up to the bucket (slot -1, so they write no KV, belonging to no
sequence), sequence slots up to max_num_seqs (no query tokens). Attention takes its launch shape
from the capture: single-token sequences over every slot, prompts over `prompt_seqs` (up to
MAX_PROMPTS of them, -1 padded) in tiles up to the bucket's length; each program finds its real
extent on the device and the rest exit at once.
"""
from __future__ import annotations

import collections
import logging
from typing import Optional

import torch

from tritongen.ops.attention import AttentionMetadata
from tritongen.runner.cuda_graph import capture_ladder
from tritongen.runner.step_layout import step_layout
from tritongen.types import ScheduledSeq

logger = logging.getLogger(__name__)

MAX_PROMPTS = 8
"""Sequences of several tokens a mixed graph takes; a step with more runs eagerly."""


def token_buckets(max_tokens: int) -> list[int]:
    """Padded step sizes: every 32 tokens to 1024, every 128 to 2048 (a 400-token prompt and 96
    decodes pad 496 rows to 512), capped at max_tokens."""
    top = min(max_tokens, 2048)
    return [s for s in list(range(32, 1025, 32)) + list(range(1152, 2049, 128)) if s < top] + [top]


def eager_reason(seqs: list[ScheduledSeq], tokens: int, max_tokens: int, slots: int, width: int) -> Optional[str]:
    """Why a step cannot replay a mixed graph, or None when it can."""
    if not seqs:
        return "no sequences"
    if tokens > max_tokens:
        return f"more tokens than the largest bucket ({max_tokens})"
    if len(seqs) > slots:
        return f"more sequences than slots ({slots})"
    if sum(1 for s in seqs if s.num_new_tokens > 1) > MAX_PROMPTS:
        return f"more than {MAX_PROMPTS} prompts"
    if any(len(s.block_table) > width for s in seqs):
        return f"a block table past {width} blocks"
    if any(s.params.prompt_logprobs is not None for s in seqs):
        return "prompt logprobs (they read every row)"
    return None


class MixedGraphs:
    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], max_tokens: int, max_seqs: int,
                 max_blocks_per_seq: int, block_size: int, device: torch.device) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.sizes = token_buckets(max_tokens)
        self.slots = max_seqs
        self.width = max_blocks_per_seq
        t, n, dev = self.sizes[-1], max_seqs, device
        self.input_ids = torch.zeros(t, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(t, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((t,), -1, dtype=torch.int64, device=dev)
        self.query_start_loc = torch.zeros(n + 1, dtype=torch.int32, device=dev)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros(n, self.width, dtype=torch.int32, device=dev)
        self.prompt_seqs = torch.full((MAX_PROMPTS,), -1, dtype=torch.int32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.replays = 0
        self.eager_steps: collections.Counter[str] = collections.Counter()

    def _meta(self, tokens: int) -> AttentionMetadata:
        # Host lists only shape the launches: one slot with all `tokens` rows makes the prompt
        # launch's tile count cover the longest prompt the bucket holds.
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:tokens], query_start_loc=self.query_start_loc,
            seq_lens=self.seq_lens, block_tables=self.block_tables,
            query_start_loc_cpu=[0] + [tokens] * self.slots, seq_lens_cpu=[tokens] + [0] * (self.slots - 1),
            block_size=self.block_size, backend="triton", prompt_seqs=self.prompt_seqs)

    def capture(self) -> None:
        self.graphs, self.outputs = capture_ladder(
            self.sizes, lambda t: self.model(self.input_ids[:t], self.positions[:t], self.kv_caches, self._meta(t)))
        logger.info("captured mixed-step CUDA graphs for %d token buckets up to %d", len(self.sizes), self.sizes[-1])

    def bucket(self, seqs: list[ScheduledSeq]) -> Optional[int]:
        """The token bucket this step replays in, or None (eager, counted in `eager_steps` by
        reason and logged the first time each reason comes up)."""
        n = sum(s.num_new_tokens for s in seqs)
        reason = eager_reason(seqs, n, self.sizes[-1], self.slots, self.width)
        if reason is None:
            return next(t for t in self.sizes if t >= n)
        if not self.eager_steps[reason]:
            logger.info("a mixed step runs eagerly (first time for this reason): %s", reason)
        self.eager_steps[reason] += 1
        return None

    def run(self, seqs: list[ScheduledSeq], tokens: int,
            input_ids: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden states [tokens, hidden], the rows of the sampling sequences' last tokens on the
        device); `input_ids` (on the device) replace the first rows' tokens (an asynchronous step)."""
        lay = step_layout(seqs, self.block_size, tokens, self.slots)
        width = len(lay.block_tables[0])
        flat = torch.tensor([lay.ids, lay.positions, lay.slot_mapping], dtype=torch.int64).pin_memory()
        prompts = lay.prompt_seqs + [-1] * (MAX_PROMPTS - len(lay.prompt_seqs))
        small = torch.tensor(lay.query_start_loc + lay.seq_lens + prompts, dtype=torch.int32).pin_memory()
        n = self.slots
        self.input_ids[:tokens].copy_(flat[0], non_blocking=True)
        self.positions[:tokens].copy_(flat[1], non_blocking=True)
        self.slot_mapping[:tokens].copy_(flat[2], non_blocking=True)
        self.query_start_loc.copy_(small[: n + 1], non_blocking=True)
        self.seq_lens.copy_(small[n + 1: 2 * n + 1], non_blocking=True)
        self.prompt_seqs.copy_(small[2 * n + 1:], non_blocking=True)
        # Columns past `width` and rows past len(seqs) keep stale block ids: the kernels read only
        # pages below each row's seq_len, and those slots have no query tokens.
        self.block_tables[: len(seqs), :width].copy_(torch.tensor(lay.block_tables, dtype=torch.int32).pin_memory(),
                                                     non_blocking=True)
        if input_ids is not None:
            self.input_ids[: input_ids.shape[0]].copy_(input_ids)
        logits_rows = torch.tensor(lay.logits_rows, dtype=torch.int64).pin_memory().to(self.input_ids.device,
                                                                                        non_blocking=True)
        self.graphs[tokens].replay()
        self.replays += 1
        return self.outputs[tokens], logits_rows


def maybe_build_mixed_graphs(model: torch.nn.Module, kv_caches: list[torch.Tensor], enabled: bool,
                             decode_graphs: bool, moe: bool, tensor_parallel: bool, max_num_batched_tokens: int,
                             max_num_seqs: int, max_model_len: int, block_size: int) -> Optional[MixedGraphs]:
    """Mixed-step graphs when asked for (the default) and they can work: where decode steps have
    graphs (CUDA, the Triton attention backend, not enforce_eager), on one GPU, for a dense model
    (an MoE layer's routing shapes its launches from the host). Elsewhere mixed steps run eagerly,
    said once at info level: the option is on by default, so that is no misconfiguration."""
    if not enabled or not decode_graphs:
        return None  # no graphs at all (CPU, enforce_eager, the reference attention) or turned off
    if moe or tensor_parallel:
        logger.info("mixed steps run eagerly: their CUDA graphs need one GPU and a dense model (%s)",
                    "an MoE model" if moe else "tensor parallelism")
        return None
    graphs = MixedGraphs(model, kv_caches, max_num_batched_tokens, max_num_seqs, -(-max_model_len // block_size),
                         block_size, kv_caches[0].device)
    graphs.capture()
    return graphs
