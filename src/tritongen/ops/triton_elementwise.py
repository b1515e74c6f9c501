"""Triton kernels for the per-token ops of a layer: RMSNorm (alone and fused with the residual add
before it; Llama's and Gemma's forms; either may quantize its output per token to e4m3 for an fp8
projection, ops.fp8.Fp8Tokens), LayerNorm with bias (alone and fused likewise: GPT-2,
Bloom), rotary, SiLU·mul, the tanh GELUs (alone: GPT-2, Bloom; times up: Gemma's GeGLU).

Why: in a CUDA-graph decode step the reference versions launch ~7 (RMSNorm), ~10 (rotary) and 2
(SiLU·mul) small kernels each, so a 32-layer 7B step ran ~1200 kernels whose fixed cost (not the
weight reads) dominated batch-1 latency. One kernel per op, one program per token.

Numerics follow ops/reference.py (the oracle): RMSNorm normalizes in float32, rounds to the
input dtype, then multiplies by the weight in that dtype; LayerNorm (F.layer_norm) takes mean and
variance in float32 and applies weight and bias in float32, one rounding at the end; rotary and
SiLU compute in float32 and round once (the reference rounds after each product; differences are
within one ulp).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritongen.ops.triton_fp8_quant import store_quantized_row


def wide_row_warps(block: int) -> int:
    """Warps of a one-program-per-row kernel that holds its row in registers (the RMSNorms and the
    quantizing SiLU·mul): 8 elements a thread, 4 to 32 warps. At batch 1 that one program is the
    whole launch, so its loads must all be in flight at once. On an H100 (benchmarks/probes/
    rowwise_fp8_probe.py, µs per call at 1 row): SiLU·mul quantized over 11008 columns 14.98 / 8.97 /
    6.25 / 5.80 at 4 / 8 / 16 / 32 warps; add + RMSNorm over 4096 quantized 3.38 / 2.88 / 2.40 at
    4 / 8 / 16, in bf16 1.86 / 1.81 / 1.84. The quantizing and plain variants of a norm must launch
    alike: their sums of squares then add in the same order, and the quantized rows are those of the
    plain output (tests/gpu/test_triton_fp8.py)."""
    return max(4, min(32, block // 256))


@triton.jit
def _scale(x, rstd, W, cols, ok, w_offset, OUT_DTYPE: tl.constexpr, OFFSET: tl.constexpr):
    """Llama: cast the normalized row to the output dtype, then scale by the weight; OFFSET
    (Gemma): scale by (offset + weight) in float32, one rounding at the end."""
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    if OFFSET:
        return ((x * rstd) * (w_offset + w)).to(OUT_DTYPE)
    return (w * (x * rstd).to(OUT_DTYPE).to(tl.float32)).to(OUT_DTYPE)


@triton.jit
def _rms_norm_kernel(X, W, Y, Q, QS, stride_x, stride_y, N, eps, w_offset, BLOCK: tl.constexpr,
                     OFFSET: tl.constexpr, QUANT: tl.constexpr):
    # QUANT: the row (rounded to Y's dtype, as stored otherwise) goes to Q/QS quantized per token
    # instead of to Y (Y then only names the dtype and is not written).
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / N + eps)
    y = _scale(x, rstd, W, cols, ok, w_offset, Y.dtype.element_ty, OFFSET)
    if QUANT:
        store_quantized_row(y.to(tl.float32), Q + row * N, QS + row, cols, ok)
    else:
        tl.store(Y + row * stride_y + cols, y, mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    x2 = _rows(x, x.shape[-1])
    y = torch.empty_like(x2)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, weight, y, None, None, x2.stride(0), y.stride(0), x2.shape[1], eps,
                                         offset, OFFSET=bool(offset), QUANT=False, **_row_launch(x2))
    return y.view(x.shape)


def _fp8_rows(x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty(x2.shape, dtype=torch.float8_e4m3fn, device=x2.device),
            torch.empty(x2.shape[0], 1, dtype=torch.float32, device=x2.device))


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) = ops.fp8.quantize_tokens(rms_norm(x)) in one launch: x [T, N] -> e4m3 [T, N], float32 [T, 1]."""
    x2 = _rows(x, x.shape[-1])
    q, qs = _fp8_rows(x2)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, weight, x2, q, qs, x2.stride(0), 0, x2.shape[1], eps, offset,
                                         OFFSET=bool(offset), QUANT=True, **_row_launch(x2))
    return q, qs


@triton.jit
def _add_residual(X, R, S, row, stride_x, stride_r, N, cols, ok):
    """s = x + r, stored to S rounded as the plain add rounds the residual stream; s in float32."""
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    r = tl.load(R + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
    s = (x + r).to(S.dtype.element_ty)
    tl.store(S + row * N + cols, s, mask=ok)
    return s.to(tl.float32)


def _row_launch(x2: torch.Tensor) -> dict:
    """BLOCK (the power of two that holds a row of x2) and num_warps (wide_row_warps) of a
    one-program-per-row kernel over x2."""
    block = triton.next_power_of_2(x2.shape[1])
    return {"BLOCK": block, "num_warps": wide_row_warps(block)}


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """t as [rows, n] with unit column stride (a copy only where the view is strided)."""
    t2 = t.reshape(-1, n)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


@triton.jit
def _add_rms_norm_kernel(X, R, W, Y, S, Q, QS, stride_x, stride_r, N, eps, w_offset, BLOCK: tl.constexpr,
                         OFFSET: tl.constexpr, QUANT: tl.constexpr):
    # QUANT: as in _rms_norm_kernel (the sum still goes to S).
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    s = _add_residual(X, R, S, row, stride_x, stride_r, N, cols, ok)
    rstd = 1.0 / tl.sqrt(tl.sum(s * s, 0) / N + eps)
    y = _scale(s, rstd, W, cols, ok, w_offset, Y.dtype.element_ty, OFFSET)
    if QUANT:
        store_quantized_row(y.to(tl.float32), Q + row * N, QS + row, cols, ok)
    else:
        tl.store(Y + row * N + cols, y, mask=ok)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) in one pass: one launch instead of two."""
    x2, r2 = _rows(x, x.shape[-1]), _rows(residual, x.shape[-1])
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    s = torch.empty_like(y)
    if x2.shape[0]:
        _add_rms_norm_kernel[(x2.shape[0],)](x2, r2, weight, y, s, None, None, x2.stride(0), r2.stride(0),
                                             x2.shape[1], eps, offset, OFFSET=bool(offset), QUANT=False,
                                             **_row_launch(x2))
    return y.view(x.shape), s.view(x.shape)


@triton.jit
def _norm_add_rms_norm_kernel(X, R, W1, W2, Y, S, stride_x, stride_r, N, eps, w_offset, BLOCK: tl.constexpr):
    # _rms_norm_kernel's row with an offset weight (Gemma's), rounded as it stores it, then
    # _add_rms_norm_kernel on it: the same arithmetic in one pass over the row.
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    normed = _scale(x, 1.0 / tl.sqrt(tl.sum(x * x, 0) / N + eps), W1, cols, ok, w_offset, Y.dtype.element_ty, True)
    r = tl.load(R + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
    s = (normed.to(tl.float32) + r).to(S.dtype.element_ty)
    tl.store(S + row * N + cols, s, mask=ok)
    s = s.to(tl.float32)
    y = _scale(s, 1.0 / tl.sqrt(tl.sum(s * s, 0) / N + eps), W2, cols, ok, w_offset, Y.dtype.element_ty, True)
    tl.store(Y + row * N + cols, y, mask=ok)


def norm_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, next_weight: torch.Tensor,
                      eps: float, offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(s, next_weight), s) with s = rms_norm(x, weight) + residual: with an offset weight
    (Gemma's post-attention norm, residual add and pre-feed-forward norm; its post-feed-forward
    norm, residual add and the next block's input norm) in one launch instead of two. Offset 0
    (Llama's rounding, which no sandwich-norm model uses) runs the two kernels: on an H100 the fused
    form of it differed from them in 9 % of the elements."""
    if not offset:
        return add_rms_norm(rms_norm(x, weight, eps), residual, next_weight, eps)
    x2, r2 = _rows(x, x.shape[-1]), _rows(residual, x.shape[-1])
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    s = torch.empty_like(y)
    if x2.shape[0]:
        _norm_add_rms_norm_kernel[(x2.shape[0],)](x2, r2, weight, next_weight, y, s, x2.stride(0), r2.stride(0),
                                                  x2.shape[1], eps, offset, **_row_launch(x2))
    return y.view(x.shape), s.view(x.shape)


def add_rms_norm_fp8(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0
                     ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """((q, scale) of quantize_tokens(rms_norm(x + residual)), x + residual) in one launch."""
    x2, r2 = _rows(x, x.shape[-1]), _rows(residual, x.shape[-1])
    s = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    q, qs = _fp8_rows(x2)
    if x2.shape[0]:
        _add_rms_norm_kernel[(x2.shape[0],)](x2, r2, weight, s, s, q, qs, x2.stride(0), r2.stride(0), x2.shape[1],
                                             eps, offset, OFFSET=bool(offset), QUANT=True, **_row_launch(x2))
    return (q, qs), s.view(x.shape)


@triton.jit
def _layer_norm_row(x, W, B, cols, ok, N, eps, OUT_DTYPE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """F.layer_norm of one float32 row: biased variance of the centred row, (x - mean) * rstd * w + b
    in float32, rounded once."""
    mean = tl.sum(x, 0) / N
    xc = tl.where(ok, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, 0) / N + eps)
    y = xc * rstd * tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(B + cols, mask=ok, other=0.0).to(tl.float32)
    return y.to(OUT_DTYPE)


@triton.jit
def _layer_norm_kernel(X, W, B, Y, stride_x, N, eps, BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + row * N + cols, _layer_norm_row(x, W, B, cols, ok, N, eps, Y.dtype.element_ty, HAS_BIAS), mask=ok)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    x2 = _rows(x, x.shape[-1])
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        _layer_norm_kernel[(x2.shape[0],)](x2, weight, weight if bias is None else bias, y, x2.stride(0),
                                           x2.shape[1], eps, BLOCK=triton.next_power_of_2(x2.shape[1]),
                                           HAS_BIAS=bias is not None)
    return y.view(x.shape)


@triton.jit
def _add_layer_norm_kernel(X, R, W, B, Y, S, stride_x, stride_r, N, eps, BLOCK: tl.constexpr,
                           HAS_BIAS: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    s = _add_residual(X, R, S, row, stride_x, stride_r, N, cols, ok)
    y = _layer_norm_row(s, W, B, cols, ok, N, eps, Y.dtype.element_ty, HAS_BIAS)
    tl.store(Y + row * N + cols, y, mask=ok)


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(layer_norm(x + residual), x + residual) in one pass: one launch instead of the add's and the norm's."""
    x2, r2 = _rows(x, x.shape[-1]), _rows(residual, x.shape[-1])
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    s = torch.empty_like(y)
    if x2.shape[0]:
        _add_layer_norm_kernel[(x2.shape[0],)](x2, r2, weight, weight if bias is None else bias, y, s, x2.stride(0),
                                               r2.stride(0), x2.shape[1], eps,
                                               BLOCK=triton.next_power_of_2(x2.shape[1]), HAS_BIAS=bias is not None)
    return y.view(x.shape), s.view(x.shape)


@triton.jit
def rotate_heads(X, O, cos, sin, sh_x, sh_o, h, d, H: tl.constexpr, HALF: tl.constexpr):
    """Rotate heads h < H of one token (halves d < HALF): X and O point at the token's head 0,
    heads sh_x / sh_o elements apart. Shared with the fused rotary + KV-write kernel."""
    ok = (h < H) & (d < HALF)
    x1 = tl.load(X + h * sh_x + d, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(X + h * sh_x + HALF + d, mask=ok, other=0.0).to(tl.float32)
    tl.store(O + h * sh_o + d, (x1 * cos - x2 * sin).to(O.dtype.element_ty), mask=ok)
    tl.store(O + h * sh_o + HALF + d, (x2 * cos + x1 * sin).to(O.dtype.element_ty), mask=ok)


@triton.jit
def rope_row(COS, SIN, t, stride_c, BLOCK_H: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """(head index column, half index row, cos, sin) of token t, in float32."""
    d = tl.arange(0, BLOCK_HALF)[None, :]
    h = tl.arange(0, BLOCK_H)[:, None]
    cos = tl.load(COS + t * stride_c + d, mask=d < HALF, other=0.0).to(tl.float32)
    sin = tl.load(SIN + t * stride_c + d, mask=d < HALF, other=0.0).to(tl.float32)
    return h, d, cos, sin


@triton.jit
def _rotary_kernel(Q, K, COS, SIN, QO, KO, stride_qt, stride_qh, stride_kt, stride_kh, stride_c,
                   HQ: tl.constexpr, HK: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr,
                   BLOCK_HALF: tl.constexpr):
    t = tl.program_id(0)
    h, d, cos, sin = rope_row(COS, SIN, t, stride_c, BLOCK_H, HALF, BLOCK_HALF)
    # q and k in one launch; outputs are contiguous [T, H, 2*HALF]
    rotate_heads(Q + t * stride_qt, QO + t * (HQ * 2 * HALF), cos, sin, stride_qh, 2 * HALF, h, d, HQ, HALF)
    rotate_heads(K + t * stride_kt, KO + t * (HK * 2 * HALF), cos, sin, stride_kh, 2 * HALF, h, d, HK, HALF)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D], k [T, Hkv, D], cos/sin [T, D] (duplicated halves) -> rotated copies."""
    T, hq, d = q.shape
    hk = k.shape[1]
    qo, ko = torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if T:
        cos, sin = cos.contiguous(), sin.contiguous()
        _rotary_kernel[(T,)](q, k, cos, sin, qo, ko, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                             cos.stride(0), HQ=hq, HK=hk, BLOCK_H=triton.next_power_of_2(max(hq, hk)),
                             HALF=d // 2, BLOCK_HALF=triton.next_power_of_2(d // 2))
    return qo, ko


@triton.jit
def silu_mul(g, u, dtype: tl.constexpr):
    """silu(g) * u in `dtype` from float32 g and u, rounded where the reference (F.silu, then *) rounds."""
    silu = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    return (silu * u).to(dtype)


@triton.jit
def _silu_mul_kernel(G, U, Y, stride_g, stride_u, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    g = tl.load(G + row * stride_g + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(U + row * stride_u + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + row * N + cols, silu_mul(g, u, Y.dtype.element_ty), mask=ok)


@triton.jit
def _silu_mul_fp8_kernel(G, U, Q, QS, Y, stride_g, stride_u, N, BLOCK: tl.constexpr):
    # One program per row: silu(g) * u rounded to Y's dtype (Y names it and is not written), then
    # quantized per token to Q / QS.
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    g = tl.load(G + row * stride_g + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(U + row * stride_u + cols, mask=ok, other=0.0).to(tl.float32)
    store_quantized_row(silu_mul(g, u, Y.dtype.element_ty).to(tl.float32), Q + row * N, QS + row, cols, ok)


def silu_and_mul_fp8(gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) = ops.fp8.quantize_tokens(silu_and_mul(gate, up)) in one launch (a row per program)."""
    g2, u2 = gate.reshape(-1, gate.shape[-1]), up.reshape(-1, up.shape[-1])
    q, qs = _fp8_rows(g2)
    if g2.shape[0]:
        _silu_mul_fp8_kernel[(g2.shape[0],)](g2, u2, q, qs, g2, g2.stride(0), u2.stride(0), g2.shape[1],
                                             **_row_launch(g2))
    return q, qs


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g2, u2 = gate.reshape(-1, gate.shape[-1]), up.reshape(-1, up.shape[-1])
    y = torch.empty(g2.shape, dtype=gate.dtype, device=gate.device)
    if g2.shape[0]:
        block = 1024
        _silu_mul_kernel[(g2.shape[0], triton.cdiv(g2.shape[1], block))](
            g2, u2, y, g2.stride(0), u2.stride(0), g2.shape[1], BLOCK=block)
    return y.view(gate.shape)


@triton.jit
def _gelu_tanh_kernel(X, U, Y, stride_x, stride_u, N, c0, BLOCK: tl.constexpr, GATED: tl.constexpr):
    """gelu_tanh(x) [* u]: 0.5 x (1 + tanh(c0 (x + 0.044715 x^3))) = x * sigmoid(2 c0 (x + 0.044715 x^3)),
    in float32, rounded once."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    y = x * tl.sigmoid(2.0 * c0 * (x + 0.044715 * x * x * x))
    if GATED:
        y = y * tl.load(U + row * stride_u + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + row * N + cols, y.to(Y.dtype.element_ty), mask=ok)


def gelu_tanh(x: torch.Tensor, c0: float, up: torch.Tensor | None = None) -> torch.Tensor:
    """A tanh GELU of `x` with its constant c0 (reference.TANH_GELU_C0), times `up` when given."""
    x2 = _rows(x, x.shape[-1])
    u2 = x2 if up is None else up.reshape(-1, up.shape[-1])
    if u2.stride(-1) != 1:
        u2 = u2.contiguous()
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = 1024
        _gelu_tanh_kernel[(x2.shape[0], triton.cdiv(x2.shape[1], block))](
            x2, u2, y, x2.stride(0), u2.stride(0), x2.shape[1], c0, BLOCK=block, GATED=up is not None)
    return y.view(x.shape)
