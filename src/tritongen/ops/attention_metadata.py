"""AttentionMetadata: where one step's tokens sit in the paged KV cache, built by the runner and
read by every attention implementation (ops/reference.py, ops/triton_attention.py) and by the
dispatch (ops/attention.py, which re-exports both names).

KV cache of one layer: [2, num_blocks, block_size, num_kv_heads, head_dim] (index 0 = K, 1 = V).
Slot s lives at block s // block_size, offset s % block_size.

The cache holds the model dtype, or float8 e4m3 (`kv_cache_dtype="fp8"`): then each layer's cache
tensor carries that layer's scales as the attribute `kv_scales` = (k_scale, v_scale), float32
scalars set by the runner (absent: 1.0, 1.0). Stored = x / scale clamped to +-448 and rounded to
nearest even (computed as x times the float32 reciprocal, the same product in every
implementation, so they store the same bits); read = stored * scale in float32.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Optional, Sequence

import torch

FP8_KV_DTYPE = torch.float8_e4m3fn
"""The element type of an fp8 KV cache (Triton's tl.float8e4nv)."""
FP8_MAX = 448.0
"""Largest finite float8 e4m3 magnitude: quantized values are clamped to it."""


def is_fp8_cache(kv_cache: torch.Tensor) -> bool:
    return kv_cache.dtype == FP8_KV_DTYPE


def kv_cache_scales(kv_cache: torch.Tensor) -> tuple[float, float]:
    """(k_scale, v_scale) of one layer's cache: read = stored * scale; (1.0, 1.0) when unset."""
    return getattr(kv_cache, "kv_scales", (1.0, 1.0))


def set_kv_cache_scales(kv_cache: torch.Tensor, k_scale: float, v_scale: float) -> None:
    """Attach a layer's scales to its cache tensor (the model passes the tensor to attention as it is)."""
    if not (k_scale > 0 and v_scale > 0):
        raise ValueError(f"KV cache scales must be positive, got k_scale={k_scale} v_scale={v_scale}")
    kv_cache.kv_scales = (_float32(k_scale), _float32(v_scale))


def _float32(x: float) -> float:
    return torch.tensor(x, dtype=torch.float32).item()


def inverse_scale(scale: float) -> float:
    """1 / scale rounded to float32: what stored values are multiplied by (x / scale)."""
    return _float32(1.0 / scale)


@dataclass
class AttentionMetadata:
    """Where one step's tokens sit in the paged KV cache. Shared by every layer of the step."""

    slot_mapping: torch.Tensor
    """[T] int64: cache slot (block_id * block_size + offset) of each new token; < 0 = padding."""
    query_start_loc: torch.Tensor
    """[B+1] int32 on device: token offsets of each sequence in the flat batch."""
    seq_lens: torch.Tensor
    """[B] int32 on device: context length of each sequence after this step."""
    block_tables: torch.Tensor
    """[B, max_blocks] int32 on device, padded with 0."""
    query_start_loc_cpu: list[int]
    """Host copy of query_start_loc (the reference loops over sequences on the host)."""
    seq_lens_cpu: list[int]
    """Host copy of seq_lens."""
    block_size: int
    backend: str = "reference"
    """The attention implementation CUDA tensors of this step take (ops.attention's registry): the
    engine's choice, so two engines in one process may differ. CPU tensors always take the reference."""
    prompt_seqs: Optional[torch.Tensor] = None
    """[K] int32 on device, or None: the sequences of several query tokens (-1: none), set for a
    batch that also has single-token ones (mixed_prompt_seqs): the Triton backend then attends the
    single-token sequences in one launch and the prompts in another over only these. A mixed
    step's CUDA graph (runner/mixed_graph.py) pads it, and its host lists only shape the launches."""

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @cached_property
    def max_query_len(self) -> int:
        starts = self.query_start_loc_cpu
        return max((b - a for a, b in zip(starts, starts[1:])), default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_cpu, default=0)


def mixed_prompt_seqs(query_lens: Sequence[int]) -> list[int]:
    """The sequences of several query tokens when the batch also has single-token ones, else []."""
    prompts = [i for i, n in enumerate(query_lens) if n > 1]
    return prompts if any(n == 1 for n in query_lens) else []


def build_attention_metadata(
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    block_size: int,
    device: torch.device | str = "cpu",
    backend: str = "reference",
) -> AttentionMetadata:
    """Metadata for a flat batch where sequence i feeds query_lens[i] tokens ending at seq_lens[i]."""
    qsl = [0]
    slots: list[int] = []
    for q_len, seq_len, table in zip(query_lens, seq_lens, block_tables):
        if q_len > seq_len or len(table) * block_size < seq_len:
            raise ValueError(f"bad sequence: q_len={q_len} seq_len={seq_len} blocks={len(table)}")
        qsl.append(qsl[-1] + q_len)
        slots.extend(table[p // block_size] * block_size + p % block_size for p in range(seq_len - q_len, seq_len))
    width = max((len(t) for t in block_tables), default=0)
    padded = [list(t) + [0] * (width - len(t)) for t in block_tables]
    prompts = mixed_prompt_seqs(query_lens)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32, device=device),
        block_tables=torch.tensor(padded, dtype=torch.int32, device=device).reshape(len(padded), width),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=list(seq_lens),
        block_size=block_size,
        backend=backend,
        prompt_seqs=torch.tensor(prompts, dtype=torch.int32, device=device) if prompts else None,
    )
