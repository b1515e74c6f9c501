"""A Triton GEMM for the skinny products of decode (M <= 16 rows against a [N, K] weight):
y = x @ weight.T (+ bias). At load, select_kernels times it against cuBLAS on the model's own
weights per shape and row count; ops.kernels.linear then sends decode batches of at most MAX_ROWS
rows here where it won, everything else to cuBLAS.

Each program owns BLOCK_N output columns and streams its [BLOCK_N, K] slab of the weight once (the
only traffic that matters), with tl.dot on a 16-row tile of x (rows past M are masked zeros);
BLOCK_N sets how many programs share the weight (N / BLOCK_N). No configuration wins on every shape
(benchmarks/probes/gemv_probe.py times them against F.linear), hence the selection by measurement.

Split-K: shapes with few N tiles (a TP=2 rank's o_proj [5120 x 2560] in 64-column tiles is 80
programs on 132 SMs) can give each N tile SPLIT_K programs, each over a BLOCK_K-aligned slice of K;
they write fp32 partial tiles to a per-device workspace and count themselves in on the tile's
counter (an acq_rel atomic after a CTA barrier, so the partials are visible to whoever counts last).
The last program sums the partials in split order 0..SPLIT_K-1, whatever order the programs arrived
in, so results are bitwise the same run to run; it stores y and resets the counter for the next
launch (CUDA-graph replays included). One kernel, no separate reduce launch; SPLIT_K == 1 is the
plain single pass (no workspace, no atomics). Split configurations are just more candidates for
select_kernels, so they are used only where measured faster.
"""
from __future__ import annotations

import itertools
import logging
from typing import Callable, Optional

import torch
import triton
import triton.language as tl

from tritongen.ops.triton_elementwise import silu_and_mul, silu_mul

logger = logging.getLogger(__name__)

BLOCK_M = 16  # tl.dot's smallest tile; decode batches up to 16 rows fit one tile
MAX_ROWS = 8  # measured wins up to 8 rows (none left at 16 on the 13B shapes)


@triton.jit
def tile_product(X, W, pid_n, M, N, K, k_start, k_end, stride_xm, stride_wn, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr, GATED: tl.constexpr):
    """(acc float32 = x[:, k_start:k_end] @ w[n, k_start:k_end].T for N tile pid_n, m, n, m_ok, n_ok):
    one program's share of the skinny GEMM. acc is [BLOCK_M, BLOCK_N]; GATED: W stacks two [N, K]
    halves (the MLP's gate rows, then its up rows) and acc is [BLOCK_M, 2 * BLOCK_N], the gate half's
    columns of the tile first, then the up half's (one pass over K streams both slabs). SiLU·mul
    belongs in this epilogue, computed once per output, not where down_proj loads its input (every
    N tile would recompute it for all BLOCK_M rows)."""
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n_ok = n < N
    m_ok = m < M
    if GATED:
        j = tl.arange(0, 2 * BLOCK_N)
        w_n = pid_n * BLOCK_N + j % BLOCK_N
        w_ok = w_n < N
        w_rows = W + (w_n + (j // BLOCK_N) * N)[:, None].to(tl.int64) * stride_wn
        acc = tl.zeros([BLOCK_M, 2 * BLOCK_N], tl.float32)
    else:
        w_ok = n_ok
        w_rows = W + n[:, None].to(tl.int64) * stride_wn
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K  # a split's tiles never pass its end: K_PER_SPLIT is a multiple of BLOCK_K
        w = tl.load(w_rows + k[None, :], mask=w_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(X + m[:, None] * stride_xm + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if IEEE:
            acc += tl.dot(x, tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w))
    return acc, m, n, m_ok, n_ok


@triton.jit
def split_k_range(K, K_PER_SPLIT, SPLIT_K: tl.constexpr, AXIS: tl.constexpr):
    """[k_start, k_end) of K that this program covers: all of K when SPLIT_K == 1, else split
    program_id(AXIS)'s slice of K_PER_SPLIT (a multiple of BLOCK_K; the last may be shorter)."""
    if SPLIT_K == 1:
        k_start = 0
        k_end = K
    else:
        k_start = tl.program_id(AXIS) * K_PER_SPLIT
        k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    return k_start, k_end


@triton.jit
def _skinny_gemm_kernel(X, W, Y, PART, COUNTS, M, N, K, K_PER_SPLIT, stride_xm, stride_wn, stride_ym,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        SPLIT_K: tl.constexpr, IEEE: tl.constexpr):
    # Grid (cdiv(N, BLOCK_N), SPLIT_K). SPLIT_K == 1: one pass over K, straight to Y (PART and COUNTS
    # unused). SPLIT_K > 1: see _split_k_reduce.
    pid_n = tl.program_id(0)
    k_start, k_end = split_k_range(K, K_PER_SPLIT, SPLIT_K, 1)
    acc, m, n, m_ok, n_ok = tile_product(X, W, pid_n, M, N, K, k_start, k_end, stride_xm, stride_wn,
                                         BLOCK_M, BLOCK_N, BLOCK_K, IEEE, False)
    y_ptrs = Y + m[:, None] * stride_ym + n[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])
    else:
        _split_k_reduce(acc, PART, COUNTS, y_ptrs, pid_n, m_ok, n_ok, BLOCK_M, BLOCK_N, SPLIT_K)


@triton.jit
def _split_k_reduce(acc, PART, COUNTS, y_ptrs, pid_n, m_ok, n_ok,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr):
    # Split tl.program_id(1) of N tile pid_n; the last to arrive stores the sum as y.
    total, last = split_k_sum(acc, PART, COUNTS, pid_n, tl.program_id(1), m_ok, BLOCK_M, BLOCK_N, SPLIT_K)
    if last:
        tl.store(y_ptrs, total.to(y_ptrs.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def split_k_sum(acc, PART, COUNTS, tile, split, m_ok,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr):
    """(total, last) for split `split` of output tile `tile`, whose partial is acc (float32
    [BLOCK_M, BLOCK_N]): last is true in exactly one of the tile's SPLIT_K programs, the last to
    arrive, and there total is the sum of all the tile's partials in split order 0..SPLIT_K-1
    (elsewhere zeros). The caller stores y (after its epilogue) only where last. Shared by every
    kernel whose last program reduces (the skinny GEMM, the FP8 weight-only GEMM)."""
    # Tile `tile` owns PART[tile * SPLIT_K : (tile + 1) * SPLIT_K] (fp32 [BLOCK_M, BLOCK_N] tiles,
    # rows past M never written nor read) and the counter COUNTS[tile], zero between launches.
    tiles = PART + tile * SPLIT_K * BLOCK_M * BLOCK_N + \
        tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tl.store(tiles + split * BLOCK_M * BLOCK_N, acc, mask=m_ok[:, None])
    # Every thread of the program has stored before one thread's gpu-scope release publishes them
    # (CUTLASS's semaphore pattern: bar.sync, then a release atomic); the acquire half makes the
    # other programs' partials visible to the last one.
    tl.debug_barrier()
    arrived = tl.atomic_add(COUNTS + tile, 1, sem="acq_rel", scope="gpu")
    last = arrived == SPLIT_K - 1
    total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if last:
        # Fixed order 0..SPLIT_K-1, whichever program came last: bitwise the same every run.
        for s in tl.static_range(SPLIT_K):
            total += tl.load(tiles + s * BLOCK_M * BLOCK_N, mask=m_ok[:, None], other=0.0, cache_modifier=".cg")
        tl.store(COUNTS + tile, 0)  # the next launch (a graph replay too) starts from zero
    return total, last


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                  block_n: int = 32, block_k: int = 256, num_warps: int = 4, num_stages: int = 4,
                  split_k: int = 1, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [M, K] (M <= 16), weight [N, K] (row-major, as nn.Linear stores it) -> [M, N] in x's dtype
    (written into `out`, contiguous [M, N], when given). split_k > 1 splits K over that many programs
    per N tile, through the device's shared workspace (split_workspace): calls on one stream only."""
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
        tiles = triton.cdiv(N, block_n)
        part = counts = None  # SPLIT_K == 1 never touches them
        k_per_split = triton.cdiv(triton.cdiv(K, split_k), block_k) * block_k
        if split_k > 1:
            part, counts = split_workspace(x.device, tiles * split_k * BLOCK_M * block_n, tiles)
        _skinny_gemm_kernel[(tiles, split_k)](
            x, weight, y, part, counts, M, N, K, k_per_split, x.stride(0), weight.stride(0), y.stride(0),
            BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, IEEE=x.dtype == torch.float32,
            num_warps=num_warps, num_stages=num_stages)
    if bias is None:
        return y
    return y.add_(bias) if out is not None else y + bias


@triton.jit
def _gated_gemm_kernel(X, W, Y, M, N, K, stride_xm, stride_wn, stride_ym, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    # Grid (cdiv(N, BLOCK_N),): gate and up columns of one N tile, then SiLU·mul on the tile.
    acc, m, n, m_ok, n_ok = tile_product(X, W, tl.program_id(0), M, N, K, 0, K, stride_xm, stride_wn,
                                         BLOCK_M, BLOCK_N, BLOCK_K, IEEE, True)
    gate, up = tl.split(tl.permute(tl.reshape(acc, [BLOCK_M, 2, BLOCK_N]), (0, 2, 1)))
    dtype = Y.dtype.element_ty
    # Rounded to the activations' dtype first, as the GEMM's output is on the unfused path.
    y = silu_mul(gate.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32), dtype)
    tl.store(Y + m[:, None] * stride_ym + n[None, :], y, mask=m_ok[:, None] & n_ok[None, :])


def gated_skinny_linear(x: torch.Tensor, weight: torch.Tensor, *, block_n: int = 32, block_k: int = 256,
                        num_warps: int = 4, num_stages: int = 4, split_k: int = 1) -> torch.Tensor:
    """SiLU·mul fused into the gate/up GEMM: x [M, K] (M <= 16), weight [2N, K] = gate rows over up
    rows (the stacked gate_up_proj, per tensor-parallel rank too) -> silu(x @ gate.T) * (x @ up.T),
    [M, N] in x's dtype. One launch instead of the GEMM and the SiLU·mul kernel. Single pass only
    (split_k must be 1: the configurations are skinny_linear's)."""
    M, K = x.shape
    N2, K2 = weight.shape
    if M > BLOCK_M or K != K2 or N2 % 2:
        raise ValueError(f"gated_skinny_linear takes x [M <= {BLOCK_M}, K] and weight [2N, K]; got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    if split_k != 1:
        raise ValueError(f"gated_skinny_linear runs single-pass configurations only, not split_k={split_k}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    y = torch.empty(M, N2 // 2, dtype=x.dtype, device=x.device)
    if M:
        _gated_gemm_kernel[(triton.cdiv(N2 // 2, block_n),)](
            x, weight, y, M, N2 // 2, K, x.stride(0), weight.stride(0), y.stride(0), BLOCK_M=BLOCK_M,
            BLOCK_N=block_n, BLOCK_K=block_k, IEEE=x.dtype == torch.float32, num_warps=num_warps,
            num_stages=num_stages)
    return y


_workspaces: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
"""device -> (fp32 partial tiles, int32 counters) that every split-K launch shares, and whose counters
the fused decode attention's split batches use too (triton_attention.decode_counters)."""
_retired: list[torch.Tensor] = []
"""Outgrown workspaces, kept alive: a CUDA graph captured before they were outgrown still uses them."""


def split_workspace(device: torch.device, floats: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The device's split-K workspace, grown to at least `floats` partial floats and `tiles` counters.
    Growing allocates, which must not happen inside CUDA graph capture (the buffers would come from
    the graph's private pool): select_kernels runs every candidate eagerly before capture, so the
    workspace already fits any configuration it can choose. Counters start at zero and every launch
    leaves them at zero (the last program of each N tile resets its own)."""
    part, counts = _workspaces.get(device, (None, None))
    if part is not None and part.numel() >= floats and counts.numel() >= tiles:
        return part, counts
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"the split workspace of {floats} floats / {tiles} counters (split-K GEMMs, split "
                           "decode attention) must grow during CUDA graph capture; run the configuration once "
                           "before capturing")
    if part is not None:
        _retired.extend((part, counts))
        floats, tiles = max(floats, part.numel()), max(tiles, counts.numel())
    part = torch.empty(floats, dtype=torch.float32, device=device)
    counts = torch.zeros(tiles, dtype=torch.int32, device=device)
    _workspaces[device] = (part, counts)
    return part, counts


# Candidate launch configurations (block_n, block_k, num_stages, split_k): the best configuration of
# every 7B / 13B / 13B TP=2 shape measured on the H200 is among them (docs/benchmarks-history.md).
CANDIDATES = [dict(block_n=bn, block_k=bk, num_warps=4, num_stages=st, split_k=1)
              for bn, (bk, st) in itertools.product((32, 64), ((128, 3), (256, 5)))]
CANDIDATES += [dict(block_n=bn, block_k=128, num_warps=4, num_stages=3, split_k=4) for bn in (32, 64)]
MIN_GAIN = 0.97  # the skinny kernel must be at least 3% faster than cuBLAS to be used


def candidates(dtype: torch.dtype) -> list[dict]:
    """CANDIDATES, with 4-byte elements at most 2 pipeline stages (5 stages of a 64 x 256 float32
    tile need 320 KB of shared memory; an H200 SM has 227 KB)."""
    if torch.empty((), dtype=dtype).element_size() < 4:
        return CANDIDATES
    return [{**c, "num_stages": min(c["num_stages"], 2)} for c in CANDIDATES]


def _bucket(rows: int) -> int:
    return 1 if rows <= 1 else MAX_ROWS


def config_for(choices: dict, weight: torch.Tensor, rows: int) -> Optional[dict]:
    """The configuration in `choices` (what select_kernels or select_gated_kernels returned) for this
    weight shape and row count; None: not this kernel."""
    return choices.get((*weight.shape, weight.dtype, _bucket(rows)))


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
def select_kernels(weights: list[torch.Tensor],
                   agree: Optional[Callable[[list[float]], list[float]]] = None) -> dict[tuple, Optional[dict]]:
    """Time cuBLAS against each candidate configuration on the model's own weights, per weight shape
    and row bucket (1, MAX_ROWS), and keep the skinny kernel only where it wins by MIN_GAIN.
    Called once at load, before CUDA graphs are captured; returns the choices made. graph_time_us
    runs every candidate eagerly on its shape before timing it, which also grows the split-K
    workspace (split_workspace) to fit any configuration chosen here: capture never allocates.

    `agree` maps this process's timings to the ones to decide on: tensor-parallel ranks pass the
    mean over the ranks, so that every rank picks the same kernels (with each rank deciding on its
    own noise, one rank ran cuBLAS where the other ran the skinny kernel, and every all-reduce
    waits for the slower one)."""
    made = {}
    for (n, k, dtype, rows), cublas, skinny in _timed_cases(weights, _time_case, candidates, agree):
        best, best_us = _fastest(candidates(dtype), skinny, cublas * MIN_GAIN)
        made[(n, k, dtype, rows)] = best
        logger.info("decode GEMM [%d x %d] %s, %d row(s): cuBLAS %.1f us, %s", n, k, dtype, rows, cublas,
                    "skinny %.1f us %s" % (best_us, best) if best else "kept")
    return made


def _fastest(configs: list[dict], times: list[float], bound: float) -> tuple[Optional[dict], float]:
    """(the configuration of the shortest time below `bound`, its time), or (None, bound)."""
    best, best_us = None, bound
    for cfg, us in zip(configs, times):
        if us < best_us:
            best, best_us = cfg, us
    return best, best_us


def _timed_cases(weights: list[torch.Tensor], time_case: Callable[[tuple, list[torch.Tensor]], list[float]],
                 configs: Callable[[torch.dtype], list[dict]],
                 agree: Optional[Callable[[list[float]], list[float]]]) -> list[tuple[tuple, float, list[float]]]:
    """[((N, K, dtype, rows), baseline µs, µs per configuration)] for every weight shape and row
    bucket (1, MAX_ROWS): time_case(case, that shape's weights) gives the baseline, then one time
    per configs(dtype); `agree` maps all the timings at once (one collective for all cases)."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for w in weights:
        groups.setdefault((*w.shape, w.dtype), []).append(w)
    cases = [(n, k, dtype, rows) for (n, k, dtype) in groups for rows in (1, MAX_ROWS)]
    times = [t for case in cases for t in time_case(case, groups[case[:3]])]
    if agree is not None:
        times = agree(times)
    out, at = [], 0
    for case in cases:
        n_cfg = len(configs(case[2]))
        out.append((case, times[at], times[at + 1:at + 1 + n_cfg]))
        at += 1 + n_cfg
    return out


def _time_case(case: tuple, group: list[torch.Tensor]) -> list[float]:
    """[cuBLAS µs, µs of each candidate (inf where it fails)] for one (N, K, dtype, rows) case."""
    import torch.nn.functional as F

    n, k, dtype, rows = case
    x = torch.randn(rows, k, device=group[0].device, dtype=dtype)
    return [graph_time_us(lambda w: F.linear(x, w), group)] + _time_candidates(skinny_linear, x, group)


def _time_candidates(kernel: Callable, x: torch.Tensor, group: list[torch.Tensor],
                     configs: Optional[list[dict]] = None) -> list[float]:
    """µs of kernel(x, w, **cfg) per configuration (candidates(dtype) by default; inf where it fails)."""
    out = []
    for cfg in candidates(x.dtype) if configs is None else configs:
        try:
            out.append(graph_time_us(lambda w, c=cfg: kernel(x, w, **c), group))
        except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory on a smaller GPU
            logger.debug("%s %s on %s %s: %s", kernel.__name__, cfg, tuple(group[0].shape), x.dtype, exc)
            out.append(float("inf"))
    return out


GATED_MIN_GAIN = 0.995
"""The gate/up GEMM with SiLU·mul in its epilogue replaces what that projection ran before (the
GEMM select_kernels chose, then the SiLU·mul kernel) where it is faster at all: it saves one
launch, a few µs of a 30-70 µs pair, which MIN_GAIN's 3 % would never let in."""


def gated_candidates(dtype: torch.dtype) -> list[dict]:
    """The single-pass candidates, plus 16-column tiles: a gated tile streams twice the weight rows."""
    single = [c for c in candidates(dtype) if c["split_k"] == 1]
    return single + [{**c, "block_n": 16} for c in single if c["block_n"] == 32]


@torch.inference_mode()
def select_gated_kernels(weights: list[torch.Tensor], gemm: Optional[dict] = None,
                         agree: Optional[Callable[[list[float]], list[float]]] = None) -> dict[tuple, Optional[dict]]:
    """select_kernels for the MLPs' stacked gate/up weights ([2N, K]): time the path they take
    unfused (the GEMM of `gemm`, what select_kernels chose for them, then the SiLU·mul kernel)
    against each gated_skinny_linear candidate, and keep the fused kernel where it wins by
    GATED_MIN_GAIN. `agree` as for select_kernels."""
    made = {}
    time_case = lambda case, group: _time_gated_case(case, group, gemm or {})  # noqa: E731
    for (n, k, dtype, rows), unfused, fused in _timed_cases(weights, time_case, gated_candidates, agree):
        best, best_us = _fastest(gated_candidates(dtype), fused, unfused * GATED_MIN_GAIN)
        made[(n, k, dtype, rows)] = best
        logger.info("gate/up GEMM + SiLU·mul [%d x %d] %s, %d row(s): unfused %.1f us, %s", n, k, dtype, rows,
                    unfused, "fused %.1f us %s" % (best_us, best) if best else "kept")
    return made


def _time_gated_case(case: tuple, group: list[torch.Tensor], gemm: dict) -> list[float]:
    """[µs of the unfused GEMM (its configuration in `gemm`) + SiLU·mul, µs of each gated candidate]
    for one (2N, K, dtype, rows) case."""
    import torch.nn.functional as F

    n, k, dtype, rows = case
    x = torch.randn(rows, k, device=group[0].device, dtype=dtype)
    cfg = config_for(gemm, group[0], rows)

    def unfused(w: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, w) if cfg is None else skinny_linear(x, w, **cfg)
        return silu_and_mul(*y.chunk(2, dim=-1))

    return [graph_time_us(unfused, group)] + _time_candidates(gated_skinny_linear, x, group, gated_candidates(dtype))


def linear(x: torch.Tensor, weight: torch.Tensor, cfg: dict, bias: Optional[torch.Tensor] = None,
           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear for x [..., K] with at most MAX_ROWS rows (the caller checks), via skinny_linear."""
    lead = x.shape[:-1]
    y = skinny_linear(x.reshape(-1, x.shape[-1]), weight, bias, **cfg, out=out)
    return y.reshape(*lead, weight.shape[0])


def gated_linear(x: torch.Tensor, weight: torch.Tensor, cfg: dict) -> torch.Tensor:
    """silu(gate) * up for x [..., K] with at most MAX_ROWS rows (the caller checks), via gated_skinny_linear."""
    lead = x.shape[:-1]
    y = gated_skinny_linear(x.reshape(-1, x.shape[-1]), weight, **cfg)
    return y.reshape(*lead, weight.shape[0] // 2)
