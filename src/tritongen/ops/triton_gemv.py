"""A Triton GEMM for the skinny products of decode (M <= 16 rows against a [N, K] weight):
y = x @ weight.T (+ bias). ops.kernels.linear sends decode batches of at most MAX_ROWS rows here on
CUDA (the model's projections and lm_head), everything else to cuBLAS.

Why: at batch 1 the H200 profile has cuBLAS reaching 3.1-3.3 TB/s on the o_proj and down_proj
shapes (split-K plus a separate reduce kernel) against 4.1 TB/s on gate_up; the GEMMs are 3.6 of
the 4.3 ms of kernels per 7B step. Here each program owns BLOCK_N output columns and streams its
[BLOCK_N, K] slab of the weight once (the only traffic that matters), with tl.dot on a 16-row
tile of x (rows past M are masked zeros). No split-K, so no second kernel; BLOCK_N sets how many
programs share the weight (N / BLOCK_N). benchmarks/gemv_probe.py times it against F.linear for
the Llama shapes, per configuration and for the configuration `decode_config` picks. On the H200
(docs/benchmarks.md) it beat cuBLAS by 3-13% at 1 row and 0-8% at 8 rows on every 7B/13B shape.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

BLOCK_M = 16  # tl.dot's smallest tile; decode batches up to 16 rows fit one tile
MAX_ROWS = 8  # measured wins up to 8 rows (none left at 16 on the 13B shapes)


@triton.jit
def _skinny_gemm_kernel(X, W, Y, M, N, K, stride_xm, stride_wn, stride_ym,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        IEEE: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n_ok = n < N
    m_ok = m < M
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    w_rows = W + n[:, None].to(tl.int64) * stride_wn
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        w = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(X + m[:, None] * stride_xm + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if IEEE:
            acc += tl.dot(x, tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w))
    tl.store(Y + m[:, None] * stride_ym + n[None, :], acc.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                  block_n: int = 32, block_k: int = 256, num_warps: int = 4, num_stages: int = 4) -> torch.Tensor:
    """x [M, K] (M <= 16), weight [N, K] (row-major, as nn.Linear stores it) -> [M, N] in x's dtype."""
    M, K = x.shape
    N, K2 = weight.shape
    if M > BLOCK_M or K != K2:
        raise ValueError(f"skinny_linear takes x [M <= {BLOCK_M}, K] and weight [N, K]; got {tuple(x.shape)} "
                         f"and {tuple(weight.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M:
        _skinny_gemm_kernel[(triton.cdiv(N, block_n),)](
            x, weight, y, M, N, K, x.stride(0), weight.stride(0), y.stride(0),
            BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, IEEE=x.dtype == torch.float32,
            num_warps=num_warps, num_stages=num_stages)
    return y if bias is None else y + bias


def decode_config(n: int, k: int) -> dict:
    """Launch configuration for a [N, K] weight, from the H200 probe: wide outputs (qkv, gate_up,
    lm_head) take 64-column programs and 128-wide K steps; narrow outputs (o_proj, down) take
    32-column programs (enough of them to fill the SMs) and deeper 256-wide K pipelines."""
    narrow = n <= k or k >= 8192
    return dict(block_n=32 if n < 8192 else 64, block_k=256 if narrow else 128, num_warps=4,
                num_stages=5 if narrow else 3)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear for x [..., K] with at most MAX_ROWS rows (the caller checks), via skinny_linear."""
    lead = x.shape[:-1]
    y = skinny_linear(x.reshape(-1, x.shape[-1]), weight, bias, **decode_config(*weight.shape))
    return y.reshape(*lead, weight.shape[0])
