"""Qwen3 / Gemma 3 qk-norm in one launch: RMSNorm over head_dim of every q head and every k head,
in place, inside the fused q|k|v projection's output.

Unfused, each of q and k is first copied out of that buffer (the split's rows are strided, so the
[T·H, D] view the norm needs is a copy) and then normalized: four launches per layer instead of
one. The rounding is the RMSNorm kernel's (`triton_elementwise._scale`), so the result equals
`reference.rms_norm` applied to q and k separately.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritongen.ops.triton_elementwise import _scale


@triton.jit
def _qk_norm_kernel(QKV, WQ, WK, stride_t, eps, w_offset, NUM_Q: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_D: tl.constexpr, OFFSET: tl.constexpr):
    t = tl.program_id(0)
    head = tl.program_id(1)  # q heads 0..NUM_Q-1, then the k heads: their columns follow q's
    cols = tl.arange(0, BLOCK_D)
    ok = cols < HEAD_DIM
    ptr = QKV + t * stride_t + head * HEAD_DIM + cols
    x = tl.load(ptr, mask=ok, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / HEAD_DIM + eps)
    if head < NUM_Q:
        y = _scale(x, rstd, WQ, cols, ok, w_offset, QKV.dtype.element_ty, OFFSET)
    else:
        y = _scale(x, rstd, WK, cols, ok, w_offset, QKV.dtype.element_ty, OFFSET)
    tl.store(ptr, y, mask=ok)


def qk_rms_norm_(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, num_q: int, num_k: int,
                 head_dim: int, eps: float, offset: float = 0.0) -> torch.Tensor:
    """Normalize the q and k heads of qkv [T, (num_q + num_k + num_v) · head_dim] in place."""
    if qkv.stride(-1) != 1:
        raise ValueError("qk_rms_norm_ needs the q|k|v columns contiguous")
    if qkv.shape[0]:
        _qk_norm_kernel[(qkv.shape[0], num_q + num_k)](
            qkv, q_weight, k_weight, qkv.stride(0), eps, offset, NUM_Q=num_q, HEAD_DIM=head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim), OFFSET=bool(offset))
    return qkv
