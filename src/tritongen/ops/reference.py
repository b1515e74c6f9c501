"""Pure-PyTorch reference ops: the oracle every fast kernel is tested against.

Each op reproduces HF transformers' Llama arithmetic (same dtypes, same order of operations) so that
float32 greedy decoding matches HF token for token. Clarity beats speed here.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F

from tritongen.ops.attention_metadata import FP8_KV_DTYPE, FP8_MAX, inverse_scale, is_fp8_cache, kv_cache_scales

if TYPE_CHECKING:
    from tritongen.ops.attention_metadata import AttentionMetadata


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    """HF LlamaRMSNorm: normalize in float32, cast back to x's dtype, then scale by weight. With
    `offset` (Gemma: 1.0) HF's GemmaRMSNorm instead: scale by (offset + weight) in float32, then cast."""
    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    if offset:
        return (h * (offset + weight.float())).to(dtype)
    return weight * h.to(dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add before a norm, fused: s = x + residual (in x's dtype); (rms_norm(s), s)."""
    s = x + residual
    return rms_norm(s, weight, eps, offset), s


def norm_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, next_weight: torch.Tensor,
                      eps: float, offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """A sandwich norm's output added to the residual stream, then the next norm (Gemma):
    s = rms_norm(x, weight) + residual; (rms_norm(s, next_weight), s)."""
    return add_rms_norm(rms_norm(x, weight, eps, offset), residual, next_weight, eps, offset)


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The SwiGLU activation of Llama's MLP: silu(gate) * up."""
    return F.silu(gate) * up


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """nn.LayerNorm over the last dimension (GPT-2, Bloom)."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add before a LayerNorm, fused: s = x + residual (in x's dtype); (layer_norm(s), s)."""
    s = x + residual
    return layer_norm(s, weight, bias, eps), s


TANH_GELU_C0 = {"gelu_new": math.sqrt(2.0 / math.pi), "gelu_pytorch_tanh": math.sqrt(2.0 / math.pi),
                "bloom_gelu": 0.79788456}
"""The tanh GELUs, 0.5 x (1 + tanh(c0 (x + 0.044715 x^3))), by their constant c0 (Bloom's is rounded
as Megatron wrote it); the fused kernels compute this form, `activation` HF's own formulas."""


def activation(x: torch.Tensor, name: str) -> torch.Tensor:
    """The MLP activation by its HF name, with HF's exact formula: the tanh GELUs differ in the
    last bits between the written-out formula (gelu_new) and torch's kernel (gelu_pytorch_tanh)."""
    if name in ("silu", "swish"):
        return F.silu(x)
    if name == "gelu_new":
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    if name == "gelu_pytorch_tanh":
        return F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu(x)
    if name == "bloom_gelu":  # Bloom's own tanh GELU, constants rounded as Megatron wrote them
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))
    raise ValueError(f"unsupported activation {name!r}")


# ---------------------------------------------------------------------------------------------
# Rotary embedding
# ---------------------------------------------------------------------------------------------

def rope_inv_freq(head_dim: int, rope_theta: float, rope_scaling: Optional[dict] = None) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] in float32 on CPU, computed exactly as HF computes them."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim
    inv_freq = 1.0 / (rope_theta ** exponents)
    rope_type = (rope_scaling or {}).get("rope_type", "default")
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / rope_scaling["factor"]
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope_scaling)
    raise ValueError(f"unsupported rope type {rope_type!r}")


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_context_len = s["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low
    high_freq_wavelen = old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [T, head_dim] in float32 for the given positions (HF's duplicated-half layout)."""
    # A single float32 product per element: bit-identical to HF's inv_freq @ position_ids.
    freqs = positions.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] by cos/sin [T, D]; like HF, in the dtype of q and k."""
    cos = cos.to(q.dtype).unsqueeze(1)
    sin = sin.to(q.dtype).unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's per-head slopes [num_heads] in float32, computed as HF's Bloom does: a geometric
    sequence from 2^(-8/n) for the largest power of two n <= num_heads, the odd powers of the
    next sequence for the remaining heads."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, dtype=torch.int32))
    if closest != num_heads:
        extra = torch.tensor(2 ** (-(2 ** -(math.log2(2 * closest) - 3))), dtype=torch.float32)
        remaining = min(closest, num_heads - closest)
        slopes = torch.cat([slopes, torch.pow(extra, torch.arange(1, 1 + 2 * remaining, 2, dtype=torch.int32))])
    return slopes


# ---------------------------------------------------------------------------------------------
# Paged KV cache and attention
# ---------------------------------------------------------------------------------------------

def quantize_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x / scale as float8 e4m3: in float32 (times the float32 reciprocal), clamped to +-448,
    rounded to nearest even."""
    return (x.to(torch.float32) * inverse_scale(scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8_KV_DTYPE)


def dequantize_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    """float8 e4m3 cache values -> float32: stored * scale."""
    return x.to(torch.float32) * scale


def write_kv_cache_ref(
    k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store k, v [T, Hkv, D] at flat slots (block_id * block_size + offset); slots < 0 are padding.
    An fp8 cache stores them quantized with the layer's scales (attention_metadata.kv_cache_scales)."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    valid = slot_mapping >= 0
    if not bool(valid.all()):  # host sync; acceptable in the oracle
        k, v, slot_mapping = k[valid], v[valid], slot_mapping[valid]
    if is_fp8_cache(kv_cache):
        k_scale, v_scale = kv_cache_scales(kv_cache)
        # index_copy_ has no float8 kernel: copy the bytes.
        k, v = quantize_kv(k, k_scale).view(torch.uint8), quantize_kv(v, v_scale).view(torch.uint8)
        kv_cache = kv_cache.view(torch.uint8)
    k_flat = kv_cache[0].view(-1, num_kv_heads, head_dim)
    v_flat = kv_cache[1].view(-1, num_kv_heads, head_dim)
    k_flat.index_copy_(0, slot_mapping, k.to(kv_cache.dtype))
    v_flat.index_copy_(0, slot_mapping, v.to(kv_cache.dtype))


def gather_kv(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V [seq_len, Hkv, D] of one sequence, read through its block table (an fp8 cache's
    dequantized, in float32)."""
    block_size = kv_cache.shape[2]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = block_table[:num_blocks].long()
    fp8 = is_fp8_cache(kv_cache)
    cache = kv_cache.view(torch.uint8) if fp8 else kv_cache  # gather the bytes: indexing kernels may lack float8
    k = cache[0, blocks].flatten(0, 1)[:seq_len]
    v = cache[1, blocks].flatten(0, 1)[:seq_len]
    if fp8:
        k_scale, v_scale = kv_cache_scales(kv_cache)
        k, v = dequantize_kv(k.view(FP8_KV_DTYPE), k_scale), dequantize_kv(v.view(FP8_KV_DTYPE), v_scale)
    return k, v


def causal_mask(q_len: int, seq_len: int, device: torch.device,
                sliding_window: Optional[int] = None) -> torch.Tensor:
    """[q_len, seq_len] bool, True = may attend. Queries sit at the last q_len positions."""
    q_pos = torch.arange(seq_len - q_len, seq_len, device=device)[:, None]
    k_pos = torch.arange(seq_len, device=device)[None, :]
    mask = k_pos <= q_pos
    if sliding_window is not None:
        mask &= k_pos > q_pos - sliding_window  # HF's sliding_window_overlay
    return mask


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
           alibi_slopes: Optional[torch.Tensor] = None, logit_softcap: Optional[float] = None) -> torch.Tensor:
    """Masked softmax attention of q [L, Hq, D] over k, v [S, Hkv, D] in float32; GQA by repeating KV.
    With `logit_softcap` c, the scaled scores s become c * tanh(s / c) before the mask (Gemma 2's
    attn_logit_softcapping, HF's order: scale, cap, mask). With `alibi_slopes` [Hq], head h adds
    slope_h * key_position to its scores (HF Bloom's form: the key's absolute position, which
    softmax sees as the relative distance, since what is constant along a query's row cancels)."""
    n_rep = q.shape[1] // k.shape[1]
    # Query head h reads KV head h // n_rep, as HF's repeat_kv lays them out.
    k = k.repeat_interleave(n_rep, dim=1) if n_rep > 1 else k
    v = v.repeat_interleave(n_rep, dim=1) if n_rep > 1 else v
    qf, kf, vf = (t.to(torch.float32).transpose(0, 1) for t in (q, k, v))  # [H, L|S, D]
    scores = torch.matmul(qf, kf.transpose(1, 2)) * scale
    if logit_softcap is not None:
        scores = torch.tanh(scores / logit_softcap) * logit_softcap
    if alibi_slopes is not None:
        k_pos = torch.arange(k.shape[0], device=q.device, dtype=torch.float32)
        scores = scores + alibi_slopes.to(torch.float32)[:, None, None] * k_pos[None, None, :]
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, vf).transpose(0, 1).to(q.dtype)


def paged_attention_ref(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: "AttentionMetadata",
    scale: float,
    sliding_window: Optional[int] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    logit_softcap: Optional[float] = None,
) -> torch.Tensor:
    """Causal attention of the flat batch q [T, Hq, D] against each sequence's cached K/V, with an
    ALiBi bias when `alibi_slopes` [Hq] is given and capped scores with `logit_softcap` (see attend).

    Sequence i's queries are q[query_start_loc[i]:query_start_loc[i+1]], at the last q_len of its
    seq_lens[i] positions; the cache must already hold all seq_lens[i] positions (write first).
    """
    out = torch.zeros_like(q)
    starts = meta.query_start_loc_cpu
    for i, seq_len in enumerate(meta.seq_lens_cpu):
        start, end = starts[i], starts[i + 1]
        if end == start:
            continue
        k, v = gather_kv(kv_cache, meta.block_tables[i], seq_len)
        mask = causal_mask(end - start, seq_len, q.device, sliding_window)
        out[start:end] = attend(q[start:end], k, v, mask, scale, alibi_slopes, logit_softcap)
    return out
