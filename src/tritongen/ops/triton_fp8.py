"""Triton kernel for FP8 weights: y = x @ (q * scale).T (+ bias) with x in bf16/fp16/fp32 and q
float8_e4m3fn, the weight upcast in registers (weight-only: activations are not quantized).

Decode GEMMs are bandwidth-bound: at batch 1 the time is the weight bytes over HBM bandwidth, so
halving the bytes (fp8 instead of bf16) halves the floor, whether the multiply runs on fp8 tensor
cores or on bf16 ones after an in-register upcast. Each program owns a [BLOCK_M, BLOCK_N] tile of y
and streams its [BLOCK_N, K] slab of q once; the scales are applied per K block ("block" layout:
one scale per tile of the weight, constant over a program's BLOCK_N x BLOCK_K piece because
BLOCK_N and BLOCK_K divide the checkpoint's block) or once at the end ("channel", "tensor").

Split-K (SPLIT_K > 1): shapes with few N tiles (o_proj 4096 x 4096 in 64-column tiles: 64 programs
on 132 SMs) give each tile SPLIT_K programs over BLOCK_K-aligned slices of K. Each writes its
float32 partial (block scales already applied per K block) to the shared split workspace, and the
last of the tile's programs to arrive sums them in split order, then applies per-channel /
per-tensor scales and the bias once: triton_gemv's split_k_sum and split_workspace, the same
deterministic, CUDA-graph-safe reduction as the bf16 skinny GEMM. SPLIT_K == 1 is the plain single
pass. Split configurations are more candidates for select_configs, used where measured faster.

Quantized tokens (`_fp8_tokens_gemm`, per-channel and per-tensor scales, at most 16 rows): x
quantized per token first (ops/triton_fp8_quant.py, one launch), then fp8 x fp8 on the tensor
cores with no upcast, computed transposed (y.T = q @ xq.T) so that the weight tile is the MMA's A
operand (64 rows: wgmma's M side) and the token rows its N side. The result is
ops.fp8.fp8_linear_ref(dynamic=True)'s, as the _scaled_mm path gives larger batches. On an H100
the product alone ran 10-19 % under the weight-only kernel on the 7B shapes, the quantization
2-6 µs more (benchmarks/probes/fp8_gemv_probe.py), so the pair wins on some shapes only: its
candidates join select_configs' measurement.

ops.fp8.fp8_linear_ref (dynamic=False for the weight-only kernel, True for quantized tokens) is the
reference; tests/gpu/test_triton_fp8.py checks both kernels against it on CUDA and, with
TRITON_INTERPRET=1, on the CPU.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import triton
import triton.language as tl

from tritongen.ops import triton_fp8_quant
from tritongen.ops.fp8_scales import Fp8Scales
from tritongen.ops.triton_gemv import split_k_range, split_k_sum, split_workspace

_KIND = {"channel": 0, "tensor": 1, "block": 2}
TOKEN_MAX_ROWS = 16
"""Rows of the quantized-token kernel's x tile (the MMA's N side): decode batches only."""


@triton.jit
def _fp8_weight_gemm(X, W, S, B, Y, PART, COUNTS, M, N, K, K_PER_SPLIT, stride_xm, stride_wn, stride_ym,
                     stride_sn, SCALE_KIND: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr,
                     HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, IEEE: tl.constexpr):
    # Grid (cdiv(N, BLOCK_N), cdiv(M, BLOCK_M), SPLIT_K). SPLIT_K == 1: one pass over K, straight to
    # Y (PART, COUNTS, K_PER_SPLIT unused). SPLIT_K > 1: split program_id(2) covers
    # [split * K_PER_SPLIT, +K_PER_SPLIT) of K (K_PER_SPLIT a multiple of BLOCK_K, so every BLOCK_K
    # piece still lies in one block of "block" scales) and the last split of the tile reduces
    # (triton_gemv.split_k_sum), then applies the epilogue.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    k_start, k_end = split_k_range(K, K_PER_SPLIT, SPLIT_K, 2)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = m < M
    n_ok = n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    w_rows = W + n[:, None].to(tl.int64) * stride_wn
    x_rows = X + m[:, None].to(tl.int64) * stride_xm
    for k0 in range(k_start, k_end, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        x = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(x.dtype)
        if IEEE:
            part = tl.dot(x, tl.trans(w), input_precision="ieee")
        else:
            part = tl.dot(x, tl.trans(w))
        if SCALE_KIND == 2:
            # BLOCK_N divides SCALE_BN and BLOCK_K divides SCALE_BK: one scale for this piece
            s = tl.load(S + (pid_n * BLOCK_N // SCALE_BN) * stride_sn + k0 // SCALE_BK)
            acc += part * s
        else:
            acc += part
    if SPLIT_K == 1:
        _fp8_epilogue(acc, S, B, Y, m, n, m_ok, n_ok, stride_ym, SCALE_KIND, HAS_BIAS)
    else:
        total, last = split_k_sum(acc, PART, COUNTS, pid_m * tl.num_programs(0) + pid_n, tl.program_id(2), m_ok,
                                  BLOCK_M, BLOCK_N, SPLIT_K)
        if last:
            _fp8_epilogue(total, S, B, Y, m, n, m_ok, n_ok, stride_ym, SCALE_KIND, HAS_BIAS)


@triton.jit
def _fp8_epilogue(acc, S, B, Y, m, n, m_ok, n_ok, stride_ym, SCALE_KIND: tl.constexpr, HAS_BIAS: tl.constexpr):
    # Per-channel / per-tensor scales once on the full sum over K (block scales are in acc already).
    if SCALE_KIND == 0:
        acc = acc * tl.load(S + n, mask=n_ok, other=0.0)[None, :]
    elif SCALE_KIND == 1:
        acc = acc * tl.load(S)
    if HAS_BIAS:
        acc += tl.load(B + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + m[:, None] * stride_ym + n[None, :], acc.to(Y.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _fp8_tokens_gemm(XQ, XS, W, S, B, Y, PART, COUNTS, M, N, K, K_PER_SPLIT, stride_xm, stride_wn, stride_ym,
                     SCALE_KIND: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    # Grid (cdiv(N, BLOCK_N), 1, SPLIT_K); XQ e4m3 [M <= BLOCK_M, K], XS its float32 row scales.
    # Splits as in _fp8_weight_gemm; the row scales apply before the split sum (the same per row).
    pid_n = tl.program_id(0)
    k_start, k_end = split_k_range(K, K_PER_SPLIT, SPLIT_K, 2)
    m = tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = m < M
    n_ok = n < N
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    w_rows = W + n[:, None].to(tl.int64) * stride_wn
    x_rows = XQ + m[:, None] * stride_xm
    for k0 in range(k_start, k_end, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        w = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(w, tl.trans(x), acc)
    acc = tl.trans(acc) * tl.load(XS + m, mask=m_ok, other=0.0)[:, None]
    if SPLIT_K == 1:
        _fp8_epilogue(acc, S, B, Y, m, n, m_ok, n_ok, stride_ym, SCALE_KIND, HAS_BIAS)
    else:
        total, last = split_k_sum(acc, PART, COUNTS, pid_n, tl.program_id(2), m_ok, BLOCK_M, BLOCK_N, SPLIT_K)
        if last:
            _fp8_epilogue(total, S, B, Y, m, n, m_ok, n_ok, stride_ym, SCALE_KIND, HAS_BIAS)


CONFIGS = tuple({"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "SPLIT_K": 1}
                for bn in (16, 32, 64) for bk in (128, 256) for w in (2, 4)) + \
    tuple({"BLOCK_N": bn, "BLOCK_K": 128, "num_warps": 4, "SPLIT_K": sk} for bn in (32, 64) for sk in (2, 4, 8))
"""Tile candidates of the decode-sized product; select_configs times them per layer shape. The
single-pass tilings, then split-K ones (2/4/8 programs per N tile over slices of K, for shapes with
few N tiles: o_proj 4096 x 4096 in 64-column tiles is 64 programs on 132 SMs). 18 candidates, so
the load-time selection compiles up to 18 variants per scale layout and dtype and times
18 x 3 row buckets CUDA graphs per distinct layer shape (a few ms each)."""
TOKEN_CONFIGS = tuple({"BLOCK_N": 64, "BLOCK_K": bk, "num_warps": 4, "SPLIT_K": sk, "QUANT": True}
                      for bk in (128, 256) for sk in (1, 2))
"""Candidates of the quantized-token kernel (per-channel and per-tensor scales): 64 weight rows a
tile (one warpgroup's wgmma M side) and the probe's winning K steps; with CONFIGS, select_configs
times 22 candidates per shape and row bucket."""
ROW_BUCKETS = (1, 8, 16)


def row_bucket(rows: int) -> int:
    return next(b for b in ROW_BUCKETS if rows <= b) if rows <= ROW_BUCKETS[-1] else 0


def candidates(scales: Fp8Scales, k: Optional[int] = None) -> list[dict]:
    """The CONFIGS this scale layout allows (block scales: tiles inside one scale block; the
    TOKEN_CONFIGS for per-channel and per-tensor scales) and, given
    the weight's K, without split-K configurations that would leave a split no K to cover. A
    split's slice of K is a multiple of BLOCK_K, which divides the scale block's K side, so block
    scales need no further restriction (each BLOCK_K piece of a split lies in one scale block)."""
    configs = list(CONFIGS) + (list(TOKEN_CONFIGS) if scales.kind != "block" else [])
    if scales.kind == "block":
        bn, bk = scales.block
        configs = [c for c in configs if bn % c["BLOCK_N"] == 0 and bk % c["BLOCK_K"] == 0]
    if k is not None:
        configs = [c for c in configs if triton.cdiv(k, _k_per_split(k, c["SPLIT_K"], c["BLOCK_K"])) == c["SPLIT_K"]]
    return configs


def _k_per_split(k: int, split_k: int, block_k: int) -> int:
    """Each split's slice of K: K / split_k rounded up to whole BLOCK_K steps (the last may be shorter)."""
    return triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k


def _blocks(scales: Fp8Scales, m: int, config: Optional[dict]) -> tuple[int, int, int, int, int]:
    block_m = 16 if m <= 16 else 64
    if config is not None:
        return block_m, config["BLOCK_N"], config["BLOCK_K"], config["num_warps"], config.get("SPLIT_K", 1)
    block_n, block_k = 64, 128
    if scales.kind == "block":
        bn, bk = scales.block
        block_n = min(block_n, bn)
        block_k = min(block_k, bk)
        if any(b < 16 or b & (b - 1) for b in (block_n, block_k)) or bn % block_n or bk % block_k:
            raise ValueError(f"fp8 block scales of {scales.block} are not supported by the Triton kernel "
                             "(each side must be a power of two of at least 16, e.g. 128 x 128)")
    return block_m, block_n, block_k, 4, 1


def fp8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, scales: Fp8Scales,
               bias: Optional[torch.Tensor] = None, config: Optional[dict] = None) -> torch.Tensor:
    """FP8 product on the Triton kernels; same result as ops.fp8.fp8_linear_ref(x, q, scale, scales,
    bias, dynamic=False) up to float32 summation order, dynamic=True's for a QUANT config.
    `config`: one of candidates(scales) (what select_configs chose), else a default weight-only tiling."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, k = x2.shape
    n = q.shape[0]
    if config is not None and config.get("QUANT"):
        xq, xs = triton_fp8_quant.quantize_tokens(x2)
        return fp8_tokens_linear(xq, xs, q, scale, scales, bias, config, x.dtype).reshape(*shape[:-1], n)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*shape[:-1], n)
    block_m, block_n, block_k, warps, split_k = _blocks(scales, m, config)
    s = scale.float() if scale.dtype != torch.float32 else scale
    bn, bk = scales.block or (1, 1)
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m), split_k)
    part = counts = None  # SPLIT_K == 1 never touches them
    if split_k > 1:
        tiles = grid[0] * grid[1]
        part, counts = split_workspace(x.device, tiles * split_k * block_m * block_n, tiles)
    _fp8_weight_gemm[grid](
        x2, q, s, bias if bias is not None else s, y, part, counts, m, n, k, _k_per_split(k, split_k, block_k),
        x2.stride(0), q.stride(0), y.stride(0), s.stride(0) if s.dim() == 2 else 0,
        SCALE_KIND=_KIND[scales.kind], SCALE_BN=bn, SCALE_BK=bk, HAS_BIAS=bias is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, IEEE=x.dtype == torch.float32,
        num_warps=warps)
    return y.reshape(*shape[:-1], n)


def fp8_tokens_linear(xq: torch.Tensor, xs: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, scales: Fp8Scales,
                      bias: Optional[torch.Tensor], config: dict, out_dtype: torch.dtype) -> torch.Tensor:
    """y [M, N] = (xq * xs) @ (q * scale).T (+ bias) in out_dtype, for tokens already quantized
    (xq e4m3 [M <= TOKEN_MAX_ROWS, K], xs float32 [M, 1] as triton_fp8_quant.quantize_tokens gives
    them) on the quantized-token kernel; `config` one of TOKEN_CONFIGS."""
    m, k = xq.shape
    n = q.shape[0]
    if m > TOKEN_MAX_ROWS or scales.kind == "block":
        raise ValueError(f"the quantized-token fp8 kernel takes at most {TOKEN_MAX_ROWS} rows and per-channel "
                         f"or per-tensor scales, got {m} rows and {scales.kind} scales")
    y = torch.empty(m, n, dtype=out_dtype, device=xq.device)
    if m == 0:
        return y
    block_n, block_k, split_k = config["BLOCK_N"], config["BLOCK_K"], config["SPLIT_K"]
    s = scale.float() if scale.dtype != torch.float32 else scale
    tiles = triton.cdiv(n, block_n)
    part = counts = None  # SPLIT_K == 1 never touches them
    if split_k > 1:
        part, counts = split_workspace(xq.device, tiles * split_k * TOKEN_MAX_ROWS * block_n, tiles)
    _fp8_tokens_gemm[(tiles, 1, split_k)](
        xq, xs, q, s, bias if bias is not None else s, y, part, counts, m, n, k, _k_per_split(k, split_k, block_k),
        xq.stride(0), q.stride(0), y.stride(0), SCALE_KIND=_KIND[scales.kind], HAS_BIAS=bias is not None,
        BLOCK_M=TOKEN_MAX_ROWS, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, num_warps=config["num_warps"])
    return y


def _producer_ops(producer: str, x: torch.Tensor) -> tuple[Callable, Callable]:
    """(plain, quantizing) calls of the op that feeds a layer its input x [rows, K] in a decode step
    (Fp8Linear.producer): the residual add and RMSNorm over K, or SiLU·mul over gate and up of K
    columns each (strided halves of one product, as the step has them); the quantizing one returns
    (q, scale)."""
    from tritongen.ops import triton_elementwise as te

    rows, k = x.shape
    if producer == "rms_norm":
        residual, weight = torch.randn_like(x), torch.ones(k, device=x.device, dtype=x.dtype)
        return (lambda: te.add_rms_norm(x, residual, weight, 1e-6)[0],
                lambda: te.add_rms_norm_fp8(x, residual, weight, 1e-6)[0])
    if producer == "silu_mul":
        gate_up = torch.randn(rows, 2 * k, device=x.device, dtype=x.dtype)
        gate, up = gate_up[:, :k], gate_up[:, k:]
        return lambda: te.silu_and_mul(gate, up), lambda: te.silu_and_mul_fp8(gate, up)
    raise ValueError(f"unknown fp8 producer {producer!r}: expected 'rms_norm' or 'silu_mul'")


def _timed_call(x: torch.Tensor, scales: Fp8Scales, config: dict, producer: Optional[str]) -> Callable:
    """What a decode step runs for one layer with `config`: fp8_linear on x; for a layer whose
    producer can quantize its input (Fp8Linear.producer), that op first, quantizing before a
    quantized-token config (the product then takes its tokens) and plain before the others. The
    quantizing epilogue runs one program per row and costs the op time at batch 1, which a
    quantized-token product must win back."""
    if producer is None:
        return lambda layer: fp8_linear(x, layer.weight, layer.weight_scale, scales, layer.bias, config)
    plain, quantizing = _producer_ops(producer, x)
    if config.get("QUANT"):
        def run(layer):
            xq, xs = quantizing()
            return fp8_tokens_linear(xq, xs, layer.weight, layer.weight_scale, scales, layer.bias, config, x.dtype)
        return run
    return lambda layer: fp8_linear(plain(), layer.weight, layer.weight_scale, scales, layer.bias, config)


@torch.inference_mode()
def select_configs(layers: list, dtype: torch.dtype,
                   agree: Optional[Callable[[list[float]], list[float]]] = None) -> dict[tuple, dict]:
    """Time every candidate tiling (candidates(scales, K)) on the layers' own weights, per
    (N, K, scale layout) and row bucket, in CUDA graphs (no launch overhead, as decode runs); each
    layer keeps its shape's fastest in `layer.kernel_configs` {row bucket: config}. Called once at
    load, before capture: graph_time_us runs each candidate eagerly first, which also grows the
    shared split-K workspace (triton_gemv.split_workspace) to fit whatever is chosen, so capture
    never allocates. A layout without candidates keeps the default tiling. Layers whose producer
    (an RMSNorm, SiLU·mul) can quantize their input (Fp8Linear.producer) are timed with that op
    before them (_timed_call), so the times of such a group include it. `agree` maps all the timings
    at once to the ones to decide on, as in triton_gemv.select_kernels (tensor-parallel ranks pass
    the mean over the ranks, so that every rank runs the same kernels).
    Returns {(N, K, kind, producer, rows): (config, microseconds)}."""
    from tritongen.ops.triton_gemv import graph_time_us

    groups: dict[tuple, list] = {}
    for layer in layers:
        groups.setdefault((*layer.weight.shape, layer.scales, layer.producer), []).append(layer)
    cases = []  # (n, k, scales, group, rows, configs)
    for (n, k, scales, _), group in groups.items():
        configs = candidates(scales, k)
        cases += [(n, k, scales, group, rows, configs) for rows in ROW_BUCKETS if configs]
    times = []
    for n, k, scales, group, rows, configs in cases:
        x = torch.randn(rows, k, device=group[0].weight.device, dtype=dtype)
        times += [graph_time_us(_timed_call(x, scales, cfg, group[0].producer), group) for cfg in configs]
    if agree is not None:
        times = agree(times)
    made, at = {}, 0
    for n, k, scales, group, rows, configs in cases:
        mine = times[at:at + len(configs)]
        at += len(configs)
        best = min(range(len(mine)), key=mine.__getitem__)
        made[(n, k, scales.kind, group[0].producer, rows)] = (configs[best], mine[best])
        for layer in group:
            layer.kernel_configs[rows] = configs[best]
    return made
