"""Does programmatic dependent launch (PDL) hide the fixed cost per kernel of batch-1 decode?

At batch 1 a TP=2 13B rank runs its 160 decode GEMMs at 3.70 TB/s against 3.98 at TP=1: the same
number of kernels, each half as long, so each kernel's launch, ramp-up and tail weigh double
(docs/benchmarks.md, seventh session). With PDL (Hopper's griddepcontrol; Triton's `launch_pdl`
launch option with `gdc_launch_dependents` / `gdc_wait` in the kernel) the next kernel is launched
while the previous one still runs and waits in hardware for its results. This probe times a chain of
dependent skinny GEMMs shaped like a TP=2 13B rank's o_proj and down_proj input/outputs
(x -> [2560 x 5120] -> [5120 x 2560] -> ...), one row, each GEMM reading the previous one's output:

- `plain`: no PDL;
- `pdl`: every kernel lets its dependents launch at once and waits for its producer before any load;
- `pdl+prefetch`: as `pdl`, but the first weight tile (which does not depend on the producer) is
  loaded before the wait;
- `cublas`: F.linear, for reference.

Each chain runs eagerly and captured in a CUDA graph (whether graph capture keeps the programmatic
edges is the first question), with enough distinct weights to defeat L2. Prints µs per GEMM, the
weight-read TB/s, and whether each variant computed what `plain` did (bit for bit; cuBLAS roughly).

    PYTHONPATH=$PWD/src python3 benchmarks/pdl_probe.py [--links 80] [--block-n 64] [--block-k 256]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

BLOCK_M = 16


@triton.jit
def _chain_gemm_kernel(X, W, Y, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PDL: tl.constexpr):
    """y [M, N] = x [M, K] @ w[N, K].T; PDL 0: none, 1: wait before any load, 2: wait after the
    first weight tile."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n_ok, m_ok = n < N, m < M
    w_rows = W + n[:, None].to(tl.int64) * K
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if PDL > 0:
        tl.extra.cuda.gdc_launch_dependents()
    if PDL == 1:
        tl.extra.cuda.gdc_wait()
    if PDL == 2:
        k = tl.arange(0, BLOCK_K)
        w = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & (k < K)[None, :], other=0.0)
        tl.extra.cuda.gdc_wait()
        x = tl.load(X + m[:, None] * K + k[None, :], mask=m_ok[:, None] & (k < K)[None, :], other=0.0)
        acc += tl.dot(x, tl.trans(w))
    for k0 in range(BLOCK_K if PDL == 2 else 0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        w = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(X + m[:, None] * K + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.dot(x, tl.trans(w))
    tl.store(Y + m[:, None] * N + n[None, :], acc.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def chain(x: torch.Tensor, weights: list[torch.Tensor], outs: list[torch.Tensor], variant: str,
          block_n: int, block_k: int) -> torch.Tensor:
    """Run the chain x -> weights[0] -> weights[1] -> ..., writing each product into outs[i]."""
    pdl = {"plain": 0, "pdl": 1, "pdl+prefetch": 2}.get(variant)
    for w, y in zip(weights, outs):
        if pdl is None:
            torch.mm(x, w.t(), out=y)
        else:
            n, k = w.shape
            _chain_gemm_kernel[(triton.cdiv(n, block_n),)](x, w, y, x.shape[0], n, k, BLOCK_M=BLOCK_M, BLOCK_N=block_n,
                                                           BLOCK_K=block_k, PDL=pdl, num_warps=4, num_stages=4,
                                                           launch_pdl=pdl > 0)
        x = y
    return x


def time_us(fn, reps: int, graph: bool) -> float:
    fn()
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    else:
        run = fn
    run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--links", type=int, default=80, help="GEMMs in the chain (distinct weights)")
    ap.add_argument("--block-n", type=int, default=64)
    ap.add_argument("--block-k", type=int, default=256)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = [(2560, 5120) if i % 2 == 0 else (5120, 2560) for i in range(args.links)]  # [N, K]
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) / k ** 0.5 for n, k in shapes]
    outs = [torch.empty(1, n, device="cuda", dtype=torch.bfloat16) for n, _ in shapes]
    x = torch.randn(1, shapes[0][1], device="cuda", dtype=torch.bfloat16, generator=gen)
    gbytes = sum(w.numel() * w.element_size() for w in weights) / 1e9
    results, reference = [], None
    for variant in ("plain", "pdl", "pdl+prefetch", "cublas"):
        def fn(v=variant):
            return chain(x, weights, outs, v, args.block_n, args.block_k)
        try:
            got = fn().float()
            torch.cuda.synchronize()
            reference = got if reference is None else reference
            # The PDL variants do the same arithmetic as plain: the same bits; cuBLAS rounds its own way
            # in each of the links, so only roughly the same.
            same = torch.equal(got, reference) if variant != "cublas" else \
                torch.allclose(got, reference, atol=0.1 * reference.abs().max().item(), rtol=0.1)
            for graph in (False, True):
                us = time_us(fn, args.reps, graph) / args.links
                results.append((variant, "graph" if graph else "eager", us, gbytes / args.links / us * 1e3, same))
        except Exception as exc:  # noqa: BLE001 - a probe: report and go on
            results.append((variant, f"failed: {type(exc).__name__}: {str(exc)[:100]}", 0.0, 0.0, False))
    print(f"chain of {args.links} dependent GEMMs, 1 row, [2560 x 5120] / [5120 x 2560] bf16, "
          f"block_n {args.block_n}, block_k {args.block_k}")
    print(f"{'variant':>14} {'launch':>8} {'us/GEMM':>9} {'TB/s':>6} result")
    for variant, mode, us, tbs, same in results:
        print(f"{variant:>14} {mode:>8} {us:9.2f} {tbs:6.2f} {'same' if same else 'DIFFERS'}")


if __name__ == "__main__":
    main()
