"""Paged attention: the metadata the runner builds each step, and dispatch to an implementation.

KV cache of one layer: [2, num_blocks, block_size, num_kv_heads, head_dim] (index 0 = K, 1 = V).
Slot s lives at block s // block_size, offset s % block_size.

Backends: the pure-PyTorch reference, and the Triton kernels (registered on first use by
select_attention_backend) with the same signatures, chosen with set_attention_backend(). The
model code calls rotary_attention(): decode batches take the backend's one fused kernel (rotary,
KV write and attention) where it has one, other batches rotary_and_write_kv() (fused where the
backend has a kernel for it) and paged_attention(); write_kv_cache() stays for callers that store
ready keys.
"""
from __future__ import annotations

import os

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, NamedTuple, Optional, Sequence

import torch

from tritongen.ops import kernels, reference


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


def build_attention_metadata(
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    block_size: int,
    device: torch.device | str = "cpu",
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
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32, device=device),
        block_tables=torch.tensor(padded, dtype=torch.int32, device=device).reshape(len(padded), width),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=list(seq_lens),
        block_size=block_size,
    )


class AttentionBackend(NamedTuple):
    write_kv_cache: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
    """(k [T, Hkv, D], v [T, Hkv, D], kv_cache, slot_mapping) -> None"""
    paged_attention: Callable[..., torch.Tensor]
    """(q [T, Hq, D], kv_cache, meta, scale, sliding_window=None) -> [T, Hq, D]"""
    rotary_write_kv: Optional[Callable[..., torch.Tensor]] = None
    """(q, k, v, cos, sin, kv_cache, slot_mapping) -> rotated q: rotary and the KV write fused;
    None = kernels.apply_rotary, then write_kv_cache."""
    decode_attention: Optional[Callable[..., torch.Tensor]] = None
    """(q, k, v, cos, sin, kv_cache, meta, scale, sliding_window=None) -> [T, Hq, D]: rotary, KV
    write and attention of a decode batch (at most one query token per sequence) in one launch, as
    batch-1 decode pays mostly per-launch cost; None = rotary_and_write_kv, then paged_attention."""


_BACKENDS: dict[str, AttentionBackend] = {
    "reference": AttentionBackend(reference.write_kv_cache_ref, reference.paged_attention_ref),
}
_backend_name = "reference"


def register_attention_backend(name: str, backend: AttentionBackend) -> None:
    _BACKENDS[name] = backend


def set_attention_backend(name: str) -> None:
    """Choose the implementation used by every layer from now on (process-wide)."""
    global _backend_name
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; available: {', '.join(sorted(_BACKENDS))}")
    _backend_name = name


def get_attention_backend() -> str:
    return _backend_name


def select_attention_backend(name: str, device: torch.device) -> str:
    """Pick the backend for a device: "auto" takes the Triton kernels on CUDA when the triton
    package is importable, else the reference. CPU tensors always use the reference (dispatch
    checks the device), so only CUDA engines change the process-wide choice."""
    if name == "auto":
        name = "reference"
        if device.type == "cuda":
            try:
                import triton  # noqa: F401
                name = "triton"
            except ImportError:
                pass
    if name == "triton":
        if device.type != "cuda":
            raise ValueError("attention_backend 'triton' needs a CUDA device")
        if "triton" not in _BACKENDS:
            register_attention_backend("triton", triton_backend())
    if device.type == "cuda":
        set_attention_backend(name)
        kernels.use_triton(name == "triton")  # the per-token ops follow the attention choice
    return name


def triton_backend() -> AttentionBackend:
    """The Triton kernels (ops/triton_attention.py); imported on first use.
    TRITONGEN_FUSED_DECODE_ATTENTION=0 leaves decode on the separate kernels (for comparisons)."""
    from tritongen.ops import triton_attention as ta

    fused = os.environ.get("TRITONGEN_FUSED_DECODE_ATTENTION", "1").lower() not in ("0", "false", "off")
    return AttentionBackend(ta.write_kv_cache_triton, ta.paged_attention_triton, ta.rotary_write_kv_triton,
                            ta.decode_attention_triton if fused else None)


def _backend_for(x: torch.Tensor) -> AttentionBackend:
    return _BACKENDS[_backend_name] if x.is_cuda else _BACKENDS["reference"]


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store this step's k, v [T, Hkv, D] into the layer's paged cache at slot_mapping."""
    _backend_for(k).write_kv_cache(k, v, kv_cache, slot_mapping)


def rotary_and_write_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] by cos/sin [T, D], store the rotated k and v at
    slot_mapping; returns the rotated q. One kernel where the backend fuses them."""
    backend = _backend_for(q)
    if backend.rotary_write_kv is not None:
        return backend.rotary_write_kv(q, k, v, cos, sin, kv_cache, slot_mapping)
    q, k = kernels.apply_rotary(q, k, cos, sin)
    backend.write_kv_cache(k, v, kv_cache, slot_mapping)
    return q


def paged_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: Optional[int] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    logit_softcap: Optional[float] = None,
) -> torch.Tensor:
    """Causal attention of q [T, Hq, D] over each sequence's cached context; returns [T, Hq, D].
    `alibi_slopes` [Hq] float32 adds ALiBi's position bias (Bloom); `logit_softcap` c caps the
    scaled scores s at c * tanh(s / c) (Gemma 2). Only the reference has those terms so far."""
    backend = _backend_for(q)
    if alibi_slopes is None and logit_softcap is None:
        return backend.paged_attention(q, kv_cache, meta, scale, sliding_window)
    if backend is not _BACKENDS["reference"]:
        raise NotImplementedError(
            f"ALiBi and logit softcapping are not on GPU yet: the {_backend_name!r} paged-attention kernels have "
            "neither term; run on CPU (--device cpu) or with attention_backend 'reference'")
    return reference.paged_attention_ref(q, kv_cache, meta, scale, sliding_window, alibi_slopes, logit_softcap)


def rotary_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                     sliding_window: Optional[int] = None, logit_softcap: Optional[float] = None) -> torch.Tensor:
    """One layer's attention from un-rotated q [T, Hq, D], k, v [T, Hkv, D]: rotate q and k by
    cos/sin [T, D], store k and v at meta.slot_mapping, attend (scores capped by `logit_softcap`
    as in paged_attention); returns [T, Hq, D]. Decode batches (max_query_len 1, a host int: no
    sync) take the backend's fused decode kernel where it has one."""
    backend = _backend_for(q)
    if backend.decode_attention is not None and meta.max_query_len == 1 and logit_softcap is None:
        return backend.decode_attention(q, k, v, cos, sin, kv_cache, meta, scale, sliding_window)
    # Write first: this step's queries attend to their own keys through the cache.
    q = rotary_and_write_kv(q, k, v, cos, sin, kv_cache, meta.slot_mapping)
    return paged_attention(q, kv_cache, meta, scale, sliding_window, logit_softcap=logit_softcap)
