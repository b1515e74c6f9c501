"""Paged attention: dispatch to an implementation, per step's metadata.

KV cache of one layer: [2, num_blocks, block_size, num_kv_heads, head_dim] (index 0 = K, 1 = V), in
the model dtype or float8 e4m3 with the layer's scales (attention_metadata.py says how it is read);
AttentionMetadata (ops/attention_metadata.py, re-exported here) says where each sequence's tokens
and blocks are, and which backend CUDA tensors take (`meta.backend`, the engine's choice).

Backends: the pure-PyTorch reference, and the Triton kernels (registered on first use by
select_attention_backend) with the same signatures. The model code calls rotary_attention()
(RoPE families) or cached_attention() (ALiBi and learned-position families): decode batches take
the backend's one fused kernel (rotary where asked, KV write and attention) where it has one, other
batches the KV write (with rotary fused where the backend has a kernel for it), then
paged_attention(). write_kv_cache() stays for callers that store ready keys.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import torch

from tritongen.ops import kernels, reference
from tritongen.ops.attention_metadata import AttentionMetadata, build_attention_metadata

__all__ = ["AttentionMetadata", "AttentionBackend", "build_attention_metadata", "cached_attention",
           "paged_attention", "register_attention_backend", "rotary_and_write_kv", "rotary_attention",
           "select_attention_backend", "write_kv_cache"]


class AttentionBackend(NamedTuple):
    write_kv_cache: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
    """(k [T, Hkv, D], v [T, Hkv, D], kv_cache, slot_mapping) -> None"""
    paged_attention: Callable[..., torch.Tensor]
    """(q [T, Hq, D], kv_cache, meta, scale, sliding_window=None, alibi_slopes=None, logit_softcap=None)
    -> [T, Hq, D]"""
    rotary_write_kv: Optional[Callable[..., torch.Tensor]] = None
    """(q, k, v, cos, sin, kv_cache, slot_mapping) -> rotated q: rotary and the KV write fused;
    None = kernels.apply_rotary, then write_kv_cache."""
    decode_attention: Optional[Callable[..., torch.Tensor]] = None
    """(q, k, v, cos, sin, kv_cache, meta, scale, sliding_window=None, alibi_slopes=None,
    logit_softcap=None) -> [T, Hq, D]: rotary (none when cos is None), KV write and attention of a
    decode batch (at most one query token per sequence) in one launch, as batch-1 decode pays
    mostly per-launch cost; None = the KV write, then paged_attention."""


_BACKENDS: dict[str, AttentionBackend] = {
    "reference": AttentionBackend(reference.write_kv_cache_ref, reference.paged_attention_ref),
}


def register_attention_backend(name: str, backend: AttentionBackend) -> None:
    _BACKENDS[name] = backend


def select_attention_backend(name: str, device: torch.device) -> str:
    """The backend name an engine on `device` uses (its AttentionMetadata carry it): "auto" takes
    the Triton kernels on CUDA when the triton package is importable, else the reference. CPU
    tensors always use the reference (dispatch checks the device)."""
    if name == "auto":
        name = "reference"
        if device.type == "cuda":
            try:
                import triton  # noqa: F401
                name = "triton"
            except ImportError:
                pass
    if name not in ("reference", "triton"):
        raise ValueError(f"unknown attention backend {name!r}; available: reference, triton")
    if name == "triton":
        if device.type != "cuda":
            raise ValueError("attention_backend 'triton' needs a CUDA device")
        if "triton" not in _BACKENDS:
            register_attention_backend("triton", triton_backend())
    if device.type == "cuda":
        kernels.use_triton(name == "triton")  # the per-token ops follow the attention choice
    return name


def triton_backend() -> AttentionBackend:
    """The Triton kernels (ops/triton_attention.py, ops/triton_kv_write.py); imported on first use."""
    from tritongen.ops import triton_attention as ta
    from tritongen.ops import triton_kv_write as tkw

    return AttentionBackend(tkw.write_kv_cache_triton, ta.paged_attention_triton, tkw.rotary_write_kv_triton,
                            ta.decode_attention_triton)


def _backend_for(x: torch.Tensor, name: str) -> AttentionBackend:
    return _BACKENDS[name] if x.is_cuda else _BACKENDS["reference"]


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                   backend: str = "reference") -> None:
    """Store this step's k, v [T, Hkv, D] into the layer's paged cache at slot_mapping."""
    _backend_for(k, backend).write_kv_cache(k, v, kv_cache, slot_mapping)


def rotary_and_write_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        kv_cache: torch.Tensor, slot_mapping: torch.Tensor, backend: str = "reference") -> torch.Tensor:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] by cos/sin [T, D], store the rotated k and v at
    slot_mapping; returns the rotated q. One kernel where the backend fuses them."""
    impl = _backend_for(q, backend)
    if impl.rotary_write_kv is not None:
        return impl.rotary_write_kv(q, k, v, cos, sin, kv_cache, slot_mapping)
    q, k = kernels.apply_rotary(q, k, cos, sin)
    impl.write_kv_cache(k, v, kv_cache, slot_mapping)
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
    scaled scores s at c * tanh(s / c) (Gemma 2)."""
    return _backend_for(q, meta.backend).paged_attention(q, kv_cache, meta, scale, sliding_window,
                                                         alibi_slopes, logit_softcap)


def rotary_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                     sliding_window: Optional[int] = None, logit_softcap: Optional[float] = None) -> torch.Tensor:
    """One layer's attention from un-rotated q [T, Hq, D], k, v [T, Hkv, D]: rotate q and k by
    cos/sin [T, D], store k and v at meta.slot_mapping, attend (scores capped by `logit_softcap`
    as in paged_attention); returns [T, Hq, D]. Decode batches (max_query_len 1, a host int: no
    sync) take the backend's fused decode kernel where it has one."""
    impl = _backend_for(q, meta.backend)
    if impl.decode_attention is not None and meta.max_query_len == 1:
        return impl.decode_attention(q, k, v, cos, sin, kv_cache, meta, scale, sliding_window, None, logit_softcap)
    # Write first: this step's queries attend to their own keys through the cache.
    q = rotary_and_write_kv(q, k, v, cos, sin, kv_cache, meta.slot_mapping, meta.backend)
    return impl.paged_attention(q, kv_cache, meta, scale, sliding_window, None, logit_softcap)


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                     meta: AttentionMetadata, scale: float, sliding_window: Optional[int] = None,
                     alibi_slopes: Optional[torch.Tensor] = None,
                     logit_softcap: Optional[float] = None) -> torch.Tensor:
    """One layer's attention of families without rotary (ALiBi, learned positions): store k, v
    [T, Hkv, D] at meta.slot_mapping, attend with q [T, Hq, D] as paged_attention does; returns
    [T, Hq, D]. Decode batches take the backend's fused decode kernel where it has one."""
    impl = _backend_for(q, meta.backend)
    if impl.decode_attention is not None and meta.max_query_len == 1:
        return impl.decode_attention(q, k, v, None, None, kv_cache, meta, scale, sliding_window, alibi_slopes,
                                     logit_softcap)
    impl.write_kv_cache(k, v, kv_cache, meta.slot_mapping)  # first: queries attend to their own keys
    return impl.paged_attention(q, kv_cache, meta, scale, sliding_window, alibi_slopes, logit_softcap)
