"""Triton kernel for dynamic per-token FP8 quantization: (q float8_e4m3fn [M, K], scale float32
[M, 1]) with scale = max(amax(|x|) * float32(1 / E4M3_MAX), MIN_SCALE) per row and q = clamp(x / scale,
±E4M3_MAX), in one launch instead of the reference's chain of small torch kernels (cast, abs, amax,
divide, clamp, divide, clamp, cast), which cost more than the FP8 GEMM it feeds at moderate row
counts.

One program per row. A row that fits one block (K <= ONE_BLOCK_MAX) is loaded once; a longer one
is read twice, in BLOCK_K pieces: once for the amax, once to quantize. x / scale is an IEEE
round-to-nearest division (tl.math.div_rn; Triton's `/` on float32 is an approximate division), the
scale a float32 product (fp8_scales.E4M3_MAX_RECIPROCAL says why) and the float32 -> e4m3
conversion rounds to nearest even, so q and scale equal ops.fp8.quantize_tokens' bit for bit
(tests/gpu/test_triton_fp8_quant.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritongen.ops.fp8_scales import E4M3_MAX, E4M3_MAX_RECIPROCAL, MIN_SCALE

ONE_BLOCK_MAX = 16384
"""Longest row quantized from registers in one load (hidden sizes, and MLP widths such as 7B's
11008 and 13B's 13824: on an H100 the looped two-pass read took 5.6 µs on 11008 against 2.0 µs
for one block of 4096)."""
LOOP_BLOCK_K = 4096
"""Piece of a longer row (down_proj's K of larger models: 28672, ...) per step of each pass."""

_E4M3_MAX = tl.constexpr(E4M3_MAX)
_MIN = tl.constexpr(MIN_SCALE)
_RECIPROCAL = tl.constexpr(E4M3_MAX_RECIPROCAL)


@triton.jit
def store_quantized_row(x, Q_row, S_row, cols, ok):
    """Quantize one float32 row (zeros where ~ok) as ops.fp8.quantize_tokens does: scale =
    max(amax * float32(1 / E4M3_MAX), MIN_SCALE), q = clamp(x / scale) to nearest even (IEEE division); store q
    at Q_row + cols and the scale at S_row. Also the epilogue of the RMSNorm kernels that hand an
    fp8 projection its input quantized (ops/triton_elementwise.py)."""
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) * _RECIPROCAL, _MIN)
    q = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -_E4M3_MAX), _E4M3_MAX)
    tl.store(Q_row + cols, q.to(Q_row.dtype.element_ty), mask=ok)
    tl.store(S_row, scale)


@triton.jit
def _quantize_tokens_kernel(X, Q, S, k_size, stride_xm, BLOCK_K: tl.constexpr, ONE_BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_xm
    q_row = Q + row * k_size
    if ONE_BLOCK:
        k = tl.arange(0, BLOCK_K)
        x = tl.load(x_row + k, mask=k < k_size, other=0.0).to(tl.float32)
        store_quantized_row(x, q_row, S + row, k, k < k_size)
    else:
        top = tl.zeros([BLOCK_K], tl.float32)
        for k0 in range(0, k_size, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_row + k, mask=k < k_size, other=0.0).to(tl.float32)
            top = tl.maximum(top, tl.abs(x))
        scale = tl.maximum(tl.max(top, axis=0) * _RECIPROCAL, _MIN)
        for k0 in range(0, k_size, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_row + k, mask=k < k_size, other=0.0).to(tl.float32)
            q = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -_E4M3_MAX), _E4M3_MAX)
            tl.store(q_row + k, q.to(Q.dtype.element_ty), mask=k < k_size)
        tl.store(S + row, scale)


def launch_config(k: int) -> dict:
    """The constexprs and num_warps a row of length k runs with (compile_kernels.py uses it too)."""
    one_block = k <= ONE_BLOCK_MAX
    block = triton.next_power_of_2(k) if one_block else LOOP_BLOCK_K
    return dict(BLOCK_K=block, ONE_BLOCK=one_block, num_warps=8 if block >= 4096 else 4)


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ops.fp8.quantize_tokens in one kernel: x [M, K] (bf16/fp16/fp32) -> (q [M, K] e4m3,
    scale float32 [M, 1])."""
    if x.dim() != 2:
        raise ValueError(f"per-token quantization takes [M, K] activations, got shape {tuple(x.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    if m and k:
        _quantize_tokens_kernel[(m,)](x, q, scale, k, x.stride(0), **launch_config(k))
    elif m:
        scale.fill_(MIN_SCALE)
    return q, scale
