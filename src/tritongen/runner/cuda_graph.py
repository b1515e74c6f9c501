"""CUDA graphs for decode steps: one graph per batch size of a ladder, batches padded up.

A decode step launches a few hundred small kernels; replaying a captured graph removes the CPU
launch cost that dominates small batches. Inputs live in static buffers that every graph reads:
each step copies the batch's index tensors into them (padding rows get slot -1, so they write no
KV, and a context of one token), then replays the smallest graph that fits.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

import torch

from tritongen.ops.attention import AttentionMetadata
from tritongen.types import ScheduledSeq

logger = logging.getLogger(__name__)


def batch_size_ladder(max_batch: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, 129, 16)) + list(range(160, 513, 32))
    return [s for s in sizes if s <= max_batch] or [1]


@torch.inference_mode()
def capture_ladder(sizes: list[int], forward: Callable[[int], torch.Tensor]
                   ) -> tuple[dict[int, torch.cuda.CUDAGraph], dict[int, torch.Tensor]]:
    """One graph of forward(size) per size, with its output tensor: largest first, so the smaller
    graphs reuse its memory pool; each size runs once before its capture (kernels compile)."""
    graphs: dict[int, torch.cuda.CUDAGraph] = {}
    outputs: dict[int, torch.Tensor] = {}
    pool = None
    for size in sorted(sizes, reverse=True):
        forward(size)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            outputs[size] = forward(size)
        pool = graph.pool()
        graphs[size] = graph
    torch.cuda.synchronize()
    return graphs, outputs


class DecodeGraphs:
    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], max_batch: int,
                 max_blocks_per_seq: int, block_size: int, device: torch.device) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.sizes = batch_size_ladder(max_batch)
        self.max_batch = self.sizes[-1]
        self.width = max_blocks_per_seq
        n, dev = self.max_batch, device
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros(n, self.width, dtype=torch.int32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def _meta(self, g: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:g], query_start_loc=self.query_start_loc[: g + 1],
            seq_lens=self.seq_lens[:g], block_tables=self.block_tables[:g],
            query_start_loc_cpu=list(range(g + 1)), seq_lens_cpu=[1] * g, block_size=self.block_size,
            backend="triton")  # maybe_build_graphs builds graphs for the Triton backend only

    def capture(self) -> None:
        self.graphs, self.outputs = capture_ladder(
            self.sizes, lambda g: self.model(self.input_ids[:g], self.positions[:g], self.kv_caches, self._meta(g)))
        logger.info("captured decode CUDA graphs for batch sizes %s", self.sizes)

    def can_run(self, seqs: list[ScheduledSeq]) -> bool:
        return (0 < len(seqs) <= self.max_batch
                and all(s.num_new_tokens == 1 and s.do_sample and len(s.block_table) <= self.width for s in seqs))

    def run(self, seqs: list[ScheduledSeq], input_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Hidden states [len(seqs), hidden] of one decode step; `input_ids` (on the device)
        replace the seqs' tokens (an asynchronous step)."""
        b = len(seqs)
        g = next(s for s in self.sizes if s >= b)
        bs = self.block_size
        ids, pos, slots, lens, rows = [], [], [], [], []
        width = max(len(s.block_table) for s in seqs)
        for s in seqs:
            p = s.start_pos
            ids.append(s.token_ids[0])
            pos.append(p)
            slots.append(s.block_table[p // bs] * bs + p % bs)
            lens.append(p + 1)
            rows.append(s.block_table + [0] * (width - len(s.block_table)))
        pad = g - b
        host = torch.tensor([ids + [0] * pad, pos + [0] * pad, slots + [-1] * pad, lens + [1] * pad],
                            dtype=torch.int64).pin_memory()
        self.input_ids[:g].copy_(host[0], non_blocking=True)
        self.positions[:g].copy_(host[1], non_blocking=True)
        self.slot_mapping[:g].copy_(host[2], non_blocking=True)
        self.seq_lens[:g].copy_(host[3], non_blocking=True)
        # Columns past `width` and padding rows keep stale block ids: the kernel only reads pages
        # below each row's seq_len, and padding rows (seq_len 1) read a harmless valid block.
        self.block_tables[:b, :width].copy_(torch.tensor(rows, dtype=torch.int32).pin_memory(), non_blocking=True)
        if input_ids is not None:
            self.input_ids[:b].copy_(input_ids)
        self.graphs[g].replay()
        return self.outputs[g][:b]


def maybe_build_graphs(model: torch.nn.Module, kv_caches: list[torch.Tensor], device: torch.device,
                       enforce_eager: bool, attention_backend: str, max_num_seqs: int,
                       max_model_len: int, block_size: int) -> Optional[DecodeGraphs]:
    """Decode graphs when they can work: CUDA, not disabled, and an attention backend that reads
    only device tensors (the reference loops over host lists, so it cannot be captured)."""
    if device.type != "cuda" or enforce_eager or attention_backend != "triton":
        return None
    graphs = DecodeGraphs(model, kv_caches, max_num_seqs, -(-max_model_len // block_size), block_size, device)
    graphs.capture()
    return graphs
