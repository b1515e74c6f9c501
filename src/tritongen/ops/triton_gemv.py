"""A Triton GEMM for the skinny products of decode (M <= 16 rows against a [N, K] weight):
y = x @ weight.T (+ bias). At load, select_kernels times it against cuBLAS on the model's own
weights per shape and row count; ops.kernels.linear then sends decode batches of at most MAX_ROWS
rows here where it won, everything else to cuBLAS.

Why: at batch 1 the H200 profile has cuBLAS reaching 3.1-3.3 TB/s on the o_proj and down_proj
shapes (split-K plus a separate reduce kernel) against 4.1 TB/s on gate_up; the GEMMs are 3.6 of
the 4.3 ms of kernels per 7B step. Here each program owns BLOCK_N output columns and streams its
[BLOCK_N, K] slab of the weight once (the only traffic that matters), with tl.dot on a 16-row
tile of x (rows past M are masked zeros). No split-K, so no second kernel; BLOCK_N sets how many
programs share the weight (N / BLOCK_N). benchmarks/gemv_probe.py times it against F.linear for
the Llama shapes, per configuration. On the H200 (docs/benchmarks.md) the best configuration beat
cuBLAS by 3-13% at 1 row on the 7B shapes, while a fixed rule lost up to 21% on some 13B and TP=2
shapes: hence the selection by measurement.
"""
from __future__ import annotations

import itertools
import logging
from typing import Optional

import torch
import triton
import triton.language as tl

logger = logging.getLogger(__name__)

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
                  block_n: int = 32, block_k: int = 256, num_warps: int = 4, num_stages: int = 4,
                  out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [M, K] (M <= 16), weight [N, K] (row-major, as nn.Linear stores it) -> [M, N] in x's dtype
    (written into `out`, contiguous [M, N], when given)."""
    M, K = x.shape
    N, K2 = weight.shape
    if M > BLOCK_M or K != K2:
        raise ValueError(f"skinny_linear takes x [M <= {BLOCK_M}, K] and weight [N, K]; got {tuple(x.shape)} "
                         f"and {tuple(weight.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    if out is not None and (out.shape != (M, N) or not out.is_contiguous()):
        raise ValueError(f"skinny_linear: out must be contiguous [{M}, {N}], got {tuple(out.shape)}")
    y = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
    if M:
        _skinny_gemm_kernel[(triton.cdiv(N, block_n),)](
            x, weight, y, M, N, K, x.stride(0), weight.stride(0), y.stride(0),
            BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, IEEE=x.dtype == torch.float32,
            num_warps=num_warps, num_stages=num_stages)
    if bias is None:
        return y
    return y.add_(bias) if out is not None else y + bias


# Candidate launch configurations (block_n, block_k, num_stages), from benchmarks/gemv_probe.py on the
# H200: the best config of every 7B/13B shape is among them, and none wins everywhere.
CANDIDATES = [dict(block_n=bn, block_k=bk, num_warps=4, num_stages=st)
              for bn, (bk, st) in itertools.product((32, 64), ((128, 3), (256, 5)))]
MIN_GAIN = 0.97  # the skinny kernel must be at least 3% faster than cuBLAS to be used
_choices: dict[tuple, Optional[dict]] = {}
"""(N, K, dtype, row bucket) -> launch configuration, or None for cuBLAS. Filled by select_kernels."""


def candidates(dtype: torch.dtype) -> list[dict]:
    """CANDIDATES, with 4-byte elements at most 2 pipeline stages (5 stages of a 64 x 256 float32
    tile need 320 KB of shared memory; an H200 SM has 227 KB)."""
    if torch.empty((), dtype=dtype).element_size() < 4:
        return CANDIDATES
    return [{**c, "num_stages": min(c["num_stages"], 2)} for c in CANDIDATES]


def _bucket(rows: int) -> int:
    return 1 if rows <= 1 else MAX_ROWS


def config_for(weight: torch.Tensor, rows: int) -> Optional[dict]:
    """The configuration select_kernels chose for this weight shape and row count; None: use cuBLAS."""
    return _choices.get((*weight.shape, weight.dtype, _bucket(rows)))


def graph_time_us(fn, weights: list[torch.Tensor], min_calls: int = 32, reps: int = 3) -> float:
    """Mean microseconds of fn(w), captured in a CUDA graph as at least `min_calls` calls cycling
    through `weights` (distinct tensors defeat L2 as a real step does; the graph leaves launch
    overhead out, as decode's graphs do)."""
    for w in weights:
        fn(w)  # compile and pick kernels outside the graph
    torch.cuda.synchronize()
    calls = max(min_calls, len(weights))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(weights[i % len(weights)])
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (reps * calls)


@torch.inference_mode()
def select_kernels(weights: list[torch.Tensor]) -> dict[tuple, Optional[dict]]:
    """Time cuBLAS against each candidate configuration on the model's own weights, per weight shape
    and row bucket (1, MAX_ROWS), and keep the skinny kernel only where it wins by MIN_GAIN.
    Called once at load, before CUDA graphs are captured; returns the choices made."""
    import torch.nn.functional as F

    groups: dict[tuple, list[torch.Tensor]] = {}
    for w in weights:
        groups.setdefault((*w.shape, w.dtype), []).append(w)
    made = {}
    for (n, k, dtype), group in groups.items():
        for rows in (1, MAX_ROWS):
            x = torch.randn(rows, k, device=group[0].device, dtype=dtype)
            cublas = graph_time_us(lambda w: F.linear(x, w), group)
            best, best_us = None, cublas * MIN_GAIN
            for cfg in candidates(dtype):
                try:
                    us = graph_time_us(lambda w, c=cfg: skinny_linear(x, w, **c), group)
                except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory on a smaller GPU
                    logger.debug("skinny GEMM %s on [%d x %d] %s: %s", cfg, n, k, dtype, exc)
                    continue
                if us < best_us:
                    best, best_us = cfg, us
            made[(n, k, dtype, rows)] = best
            logger.info("decode GEMM [%d x %d] %s, %d row(s): cuBLAS %.1f us, %s", n, k, dtype, rows, cublas,
                        "skinny %.1f us %s" % (best_us, best) if best else "kept")
    _choices.update(made)
    return made


def linear(x: torch.Tensor, weight: torch.Tensor, cfg: dict, bias: Optional[torch.Tensor] = None,
           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear for x [..., K] with at most MAX_ROWS rows (the caller checks), via skinny_linear."""
    lead = x.shape[:-1]
    y = skinny_linear(x.reshape(-1, x.shape[-1]), weight, bias, **cfg, out=out)
    return y.reshape(*lead, weight.shape[0])
