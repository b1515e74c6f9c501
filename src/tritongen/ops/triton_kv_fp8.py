"""The fp8 (float8 e4m3) KV cache in the Triton attention kernels (ops/triton_attention.py): the
conversions between a K/V value and what the cache stores, behind a constexpr FP8 flag, so a
model-dtype cache compiles to the code it always had (the value stored and loaded as it is).

Arithmetic (ops/attention_metadata.py, reference.quantize_kv / dequantize_kv): stored = x times the
float32 reciprocal of the layer's scale, clamped to +-448, rounded to nearest even; read = stored *
scale in float32. The scales are kernel scalars (constant per layer, so CUDA graphs capture them).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritongen.ops.attention_metadata import inverse_scale, kv_cache_scales
from tritongen.ops.triton_elementwise import rotate_heads


@triton.jit
def to_cache(x, inv_scale, FP8: tl.constexpr):
    """A K or V value as the cache stores it: itself (the cache is in its dtype), or with FP8
    x / scale in float32 (times the reciprocal), clamped to +-448, rounded to nearest even: the
    arithmetic of reference.quantize_kv."""
    if FP8:
        y = x.to(tl.float32) * inv_scale
        x = tl.minimum(tl.maximum(y, -448.0), 448.0).to(tl.float8e4nv)
    return x


@triton.jit
def from_cache(x, scale, dtype: tl.constexpr, FP8: tl.constexpr):
    """A tile loaded from the cache as float32 attention (IEEE) takes it: itself, or with FP8
    stored * scale in float32, then in `dtype` (the queries') for tl.dot. 16-bit queries take the
    stored values as they are (fp8_queries)."""
    if FP8:
        x = (x.to(tl.float32) * scale).to(dtype)
    return x


@triton.jit
def fp8_queries(q, FP8: tl.constexpr, IEEE: tl.constexpr):
    """The queries as the attention multiplies them: themselves, or over an FP8 cache with 16-bit
    queries, in float16 (clamped to its +-65504): the cache's e4m3 tiles then convert to float16
    exactly, one instruction per two values, and go to the tensor cores as stored, the layer's
    scales applied to the float32 scores (k_scale) and to V's float16 tiles (v_scale). Dequantizing
    every element instead (float32, times the scale, rounded to bf16) costs more issue slots than
    the tile's bytes take to load (docs/benchmarks.md, "The fp8 cache's attention")."""
    if FP8 and not IEEE:
        q = tl.minimum(tl.maximum(q.to(tl.float32), -65504.0), 65504.0).to(tl.float16)
    return q


@triton.jit
def rotate_keys_into_cache(X, O, cos, sin, sh_x, sh_o, h, d, inv_scale, H: tl.constexpr, HALF: tl.constexpr,
                           FP8: tl.constexpr):
    """rotate_heads (triton_elementwise) of keys into the cache. With FP8 each rotated element is
    rounded to the keys' dtype as rotate_heads rounds it, then quantized (to_cache): the cache
    holds quantize(rotary(k)), as the reference's rotary followed by its KV write stores."""
    if FP8:
        ok = (h < H) & (d < HALF)
        x1 = tl.load(X + h * sh_x + d, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(X + h * sh_x + HALF + d, mask=ok, other=0.0).to(tl.float32)
        dtype = X.dtype.element_ty
        tl.store(O + h * sh_o + d, to_cache((x1 * cos - x2 * sin).to(dtype), inv_scale, FP8), mask=ok)
        tl.store(O + h * sh_o + HALF + d, to_cache((x2 * cos + x1 * sin).to(dtype), inv_scale, FP8), mask=ok)
    else:
        rotate_heads(X, O, cos, sin, sh_x, sh_o, h, d, H, HALF)


def inverse_scales(kv_cache: torch.Tensor) -> tuple[float, float]:
    """(1 / k_scale, 1 / v_scale) in float32: what the write kernels multiply by."""
    k_scale, v_scale = kv_cache_scales(kv_cache)
    return inverse_scale(k_scale), inverse_scale(v_scale)
