"""Triton-language KV-cache writes of a step's new keys and values: the plain write (families
without rotary, and rotary computed apart), and rotary on q and k fused with the write of the
rotated k and of v. A negative slot is a padding row (CUDA-graph batches) and writes nothing. An
fp8 cache stores x / scale quantized (ops/triton_kv_fp8.py). The attention that reads the cache is
ops/triton_attention.py; the pure-PyTorch twins are in ops/reference.py.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritongen.ops.attention_metadata import is_fp8_cache
from tritongen.ops.triton_elementwise import rope_row, rotate_heads
from tritongen.ops.triton_kv_fp8 import inverse_scales, rotate_keys_into_cache, to_cache


@triton.jit
def _write_kv_kernel(K, V, KC, VC, SLOTS, k_inv, v_inv, stride_kt, stride_kh, stride_vt, stride_vh, stride_cs,
                     stride_ch, NUM_HEADS: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_D: tl.constexpr, FP8: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(SLOTS + t)
    if slot >= 0:  # negative slots are padding rows (CUDA-graph batches)
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        ok = (d < HEAD_DIM) & (h < NUM_HEADS)
        dst = slot.to(tl.int64) * stride_cs + h * stride_ch + d
        # k and v may have different strides (v can be a view into a fused qkv output).
        tl.store(KC + dst, to_cache(tl.load(K + t * stride_kt + h * stride_kh + d, mask=ok), k_inv, FP8), mask=ok)
        tl.store(VC + dst, to_cache(tl.load(V + t * stride_vt + h * stride_vh + d, mask=ok), v_inv, FP8), mask=ok)


def write_kv_cache_triton(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    T, H, D = k.shape
    if T == 0:
        return
    kc, vc = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, H, D], contiguous slots
    _write_kv_kernel[(T,)](k, v, kc, vc, slot_mapping, *inverse_scales(kv_cache), k.stride(0), k.stride(1),
                           v.stride(0), v.stride(1), kc.stride(1), kc.stride(2),
                           NUM_HEADS=H, BLOCK_H=triton.next_power_of_2(H), HEAD_DIM=D,
                           BLOCK_D=triton.next_power_of_2(D), FP8=is_fp8_cache(kv_cache))


@triton.jit
def _rotary_write_kv_kernel(Q, K, V, COS, SIN, QO, KC, VC, SLOTS, k_inv, v_inv, stride_qt, stride_qh, stride_kt,
                            stride_kh, stride_vt, stride_vh, stride_c, stride_cs, stride_ch,
                            HQ: tl.constexpr, HK: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr,
                            BLOCK_HALF: tl.constexpr, FP8: tl.constexpr):
    t = tl.program_id(0)
    h, d, cos, sin = rope_row(COS, SIN, t, stride_c, BLOCK_H, HALF, BLOCK_HALF)
    # rotated q is contiguous [T, HQ, 2*HALF]
    rotate_heads(Q + t * stride_qt, QO + t * (HQ * 2 * HALF), cos, sin, stride_qh, 2 * HALF, h, d, HQ, HALF)
    slot = tl.load(SLOTS + t)
    if slot >= 0:  # negative slots are padding rows (CUDA-graph batches)
        dst = slot.to(tl.int64) * stride_cs
        rotate_keys_into_cache(K + t * stride_kt, KC + dst, cos, sin, stride_kh, stride_ch, h, d, k_inv, HK, HALF,
                                FP8)
        ok = (h < HK) & (d < HALF)
        for half in tl.static_range(2):
            src = V + t * stride_vt + h * stride_vh + half * HALF + d
            tl.store(VC + dst + h * stride_ch + half * HALF + d, to_cache(tl.load(src, mask=ok), v_inv, FP8),
                     mask=ok)


def rotary_write_kv_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """Rotary on q and k, and the KV-cache write of the rotated k and of v, in one launch (the
    rotated k never goes through memory on its own). Returns the rotated q, contiguous [T, Hq, D].
    Numerics as ops/triton_elementwise's rotary: float32, rounded once."""
    T, hq, d = q.shape
    hk = k.shape[1]
    qo = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if T:
        cos, sin = cos.contiguous(), sin.contiguous()
        kc, vc = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, H, D], contiguous slots
        _rotary_write_kv_kernel[(T,)](
            q, k, v, cos, sin, qo, kc, vc, slot_mapping, *inverse_scales(kv_cache), q.stride(0), q.stride(1),
            k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0), kc.stride(1), kc.stride(2),
            HQ=hq, HK=hk, BLOCK_H=triton.next_power_of_2(max(hq, hk)), HALF=d // 2,
            BLOCK_HALF=triton.next_power_of_2(d // 2), FP8=is_fp8_cache(kv_cache))
    return qo
