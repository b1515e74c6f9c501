"""Can the idle tail of a latency-bound kernel pull the next GEMM's weights into L2?

At TP=2 batch 1 the GEMM + all-reduce kernel ends with one program doing the handshake with the peer
(~3 µs) while HBM idles; the next GEMM (gate_up after o_proj, the next layer's qkv after down_proj)
then streams its weights from HBM at ~3.7 TB/s. If that kernel's other programs first loaded the
start of the next weight into L2 (evict_last), the next GEMM would find part of it there. This probe
times a chain of one-row GEMMs shaped like a 13B TP=2 rank's layer (qkv [3840 x 5120], o [5120 x
2560], gate_up [13824 x 5120], down [5120 x 6912]; 10 layers, distinct weights, cuBLAS), each
followed by a `tail` kernel: one program spins for --tail-us (the handshake stand-in), the other
programs prefetch the first --prefetch-mb of the next weight into L2 (`prefetch.global.L2::evict_last`,
one per 128-byte line of the rows' first columns, as the GEMM's programs read them) and exit. µs
per layer for each prefetch size, in a CUDA graph.

On an H200 (docs/benchmarks.md, eighth session) it did not pay: 94.75 µs per layer without
prefetch, 95.1-97.4 with 4-32 MB, so the engine does not prefetch.

    PYTHONPATH=$PWD/src python3 benchmarks/prefetch_probe.py --prefetch-mb 0,4,8,16,24 --tail-us 3
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from pdl_probe import time_us  # a sibling script: benchmarks/ is on sys.path when run as a script


@triton.jit
def prefetch_l2(ptrs):
    """prefetch.global.L2::evict_last of each address: fire and forget (no register waits on it)."""
    return tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _tail_kernel(W, SINK, rows, cols_pf, stride_w, spin, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pid = tl.program_id(0)
    if pid == 0:  # the handshake stand-in: a dependent chain of `spin` steps
        x = tl.zeros([1], tl.float32) + spin.to(tl.float32)
        for _ in range(spin):
            x = x * 0.999 + 1.0
        tl.store(SINK + tl.arange(0, 1), x, mask=x == -1.0)
    else:  # prefetchers: row blocks pid-1, pid-1+(P-1), ...; one prefetch per 128-byte line
        r = tl.arange(0, BLOCK_R)[:, None]
        c = tl.arange(0, BLOCK_C)[None, :] * 64  # bf16: 64 elements a line
        got = tl.zeros([BLOCK_R, BLOCK_C], tl.int32)
        for r0 in range((pid - 1) * BLOCK_R, rows, (tl.num_programs(0) - 1) * BLOCK_R):
            ok = (r0 + r < rows) & (c < cols_pf)
            got += prefetch_l2(tl.where(ok, W + (r0 + r).to(tl.int64) * stride_w + c, W))
        tl.store(SINK + 1 + tl.arange(0, 1), tl.sum(tl.sum(got, 1), 0).to(tl.float32) + tl.zeros([1], tl.float32),
                 mask=tl.zeros([1], tl.int32) + tl.sum(tl.sum(got, 1), 0) == 12345)  # never: keeps the asm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefetch-mb", default="0,4,8,16,24")
    ap.add_argument("--tail-us", type=float, default=3.0)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--programs", type=int, default=132)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    dev = torch.device("cuda")
    shapes = [(3840, 5120), (5120, 2560), (13824, 5120), (5120, 6912)] * args.layers  # [N, K]
    ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.01 for n, k in shapes]
    xs = [torch.randn(1, k, device=dev, dtype=torch.bfloat16) for _, k in shapes]
    outs = [torch.empty(1, n, device=dev, dtype=torch.bfloat16) for n, _ in shapes]
    sink = torch.zeros(4096, device=dev)
    # Calibrate the spin count to --tail-us with a lone tail kernel.
    spin = 1000
    for _ in range(3):
        def tails(spin=spin) -> None:
            for _ in range(20):
                _tail_kernel[(1,)](ws[0], sink, 1, 0, 1, spin, BLOCK_R=8, BLOCK_C=16)
        us = time_us(tails, 20, graph=True) / 20
        spin = max(1, int(spin * args.tail_us / us))
    print(f"tail: {spin} spin steps ~ {args.tail_us} us; {args.programs} programs")
    gbytes = sum(w.numel() * 2 for w in ws) / 1e9
    print(f"{'prefetch MB':>11} {'us/layer':>9} {'GEMM TB/s':>9}")
    for mb in (float(v) for v in args.prefetch_mb.split(",")):
        def chain(mb=mb) -> None:
            for i, (w, x, y) in enumerate(zip(ws, xs, outs)):
                torch.mm(x, w.t(), out=y)
                nxt = ws[(i + 1) % len(ws)]
                cols = min(nxt.shape[1], int(mb * 1e6 / 2 / nxt.shape[0]) // 64 * 64)
                _tail_kernel[(args.programs if cols else 1,)](nxt, sink, nxt.shape[0], cols, nxt.stride(0), spin,
                                                              BLOCK_R=8, BLOCK_C=16)
        us = time_us(chain, args.reps, graph=True)
        print(f"{mb:>11.0f} {us / args.layers:>9.2f} {gbytes / us * 1e3:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
