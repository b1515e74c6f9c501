"""FP8 decode GEMMs (M <= 16 rows against an fp8 [N, K] weight with per-channel scales), each variant
timed in a CUDA graph that cycles through enough weight copies to defeat L2, beside the bf16 paths
on bf16 copies of the same shapes:

- `current`: ops.triton_fp8.fp8_linear, the fastest of its candidates (x @ w.T, weight as tl.dot's
  B operand, upcast to bf16 in registers);
- `swap`: the product computed transposed, y.T = w @ x.T, so that the upcast weight tile is tl.dot's
  A operand (Hopper's wgmma takes A from registers; B, the 16-row x tile, from shared memory);
- `swap8`: the same with x quantized per token to e4m3 beforehand (fp8 x fp8 on the tensor cores, no
  upcast): ops.triton_fp8.fp8_tokens_linear, the quantized-token kernel; the quantization kernel's
  own time is reported apart (`quant x`);
- `bf16`: cuBLAS and the best triton_gemv.skinny_linear candidate on bf16 weights (what the bf16
  model runs; its bytes are twice the fp8 ones).

    PYTHONPATH=$PWD/src python3 benchmarks/probes/fp8_gemv_probe.py [--rows 1,8,16] [--shapes 7b]

Prints every variant's best µs and fp8-byte TB/s per shape and row count, and a table last. On an
H100 (docs/benchmarks.md, "FP8 weights") `swap8` was the fastest on every 7B shape, 10-19 % under
`current`, but only with x already quantized: with the quantization kernel's 2-6 µs added it wins
on some shapes only (select_configs measures the pair), and a kernel that quantized x itself (each
program reading x for the amax) lost on every shape; the whole gain needs the quantization fused
into the producers of x (the norms, SiLU·mul).
`--check` only compares each variant with the reference on small random inputs (CPU: Triton's
interpreter with TRITON_INTERPRET=1).
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))

from tritongen.ops.fp8 import Fp8Scales, fp8_linear_ref, quantize_weight  # noqa: E402
from tritongen.ops.triton_fp8 import _fp8_epilogue  # noqa: E402
from tritongen.ops.triton_gemv import split_k_range, split_k_sum  # noqa: E402

SHAPES = {
    "7b": [("qkv", 12288, 4096), ("o_proj", 4096, 4096), ("gate_up", 22016, 4096), ("down", 4096, 11008)],
    "13b": [("qkv", 15360, 5120), ("o_proj", 5120, 5120), ("gate_up", 27648, 5120), ("down", 5120, 13824)],
}


@triton.jit
def _swap_kernel(X, W, S, Y, PART, COUNTS, M, N, K, K_PER_SPLIT, stride_xm, stride_wn, stride_ym,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                 IEEE: tl.constexpr):
    # acc [BLOCK_N, BLOCK_M] = w[n tile, k slice] (upcast) @ x[:, k slice].T; grid (cdiv(N, BLOCK_N), 1,
    # SPLIT_K); reduction and epilogue those of the quantized-token kernel (ops/triton_fp8.py).
    pid_n = tl.program_id(0)
    k_start, k_end = split_k_range(K, K_PER_SPLIT, SPLIT_K, 2)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n_ok = n < N
    m_ok = m < M
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    w_rows = W + n[:, None].to(tl.int64) * stride_wn
    x_rows = X + m[:, None] * stride_xm
    for k0 in range(k_start, k_end, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        w = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(w.to(x.dtype), tl.trans(x), acc, input_precision="ieee")
        else:
            acc = tl.dot(w.to(x.dtype), tl.trans(x), acc)
    acc = tl.trans(acc)
    if SPLIT_K == 1:
        _fp8_epilogue(acc, S, S, Y, m, n, m_ok, n_ok, stride_ym, 0, False)
    else:
        total, last = split_k_sum(acc, PART, COUNTS, pid_n, tl.program_id(2), m_ok, BLOCK_M, BLOCK_N, SPLIT_K)
        if last:
            _fp8_epilogue(total, S, S, Y, m, n, m_ok, n_ok, stride_ym, 0, False)


def swap_linear(x, q, scale, *, block_n=64, block_k=256, num_warps=4, num_stages=4, split_k=1):
    """y [M, N] = x @ (q * scale[:, None]).T; x [M <= 16, K] bf16/fp32."""
    from tritongen.ops.triton_gemv import split_workspace

    m, k = x.shape
    n = q.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    tiles = triton.cdiv(n, block_n)
    part = counts = None
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    if split_k > 1:
        part, counts = split_workspace(x.device, tiles * split_k * 16 * block_n, tiles)
    _swap_kernel[(tiles, 1, split_k)](
        x, q, scale, y, part, counts, m, n, k, k_per_split, x.stride(0), q.stride(0), y.stride(0), BLOCK_M=16,
        BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, IEEE=x.dtype == torch.float32, num_warps=num_warps,
        num_stages=num_stages)
    return y


def swap_configs(splits) -> list[dict]:
    return [dict(block_n=bn, block_k=bk, num_warps=w, num_stages=st, split_k=sk)
            for sk, bn, bk, w, st in itertools.product(splits, (64, 128), (128, 256), (4,), (3, 5))]


def check(device: str) -> None:
    torch.manual_seed(0)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    for n, k, rows in ((96, 512, 1), (192, 1024, 5), (128, 768, 16)):
        q, s = quantize_weight(torch.randn(n, k, device=device), Fp8Scales("channel"))
        x = torch.randn(rows, k, device=device).to(dtype)
        want = fp8_linear_ref(x, q, s, Fp8Scales("channel"), dynamic=False).float()
        for cfg in swap_configs((1, 2, 4))[:: (1 if device == "cuda" else 5)]:
            got = swap_linear(x, q, s, **cfg).float()
            err = ((got - want).norm() / want.norm()).item()
            assert err < (1e-5 if dtype == torch.float32 else 1e-2), (n, k, rows, cfg, err)
    print("check: every variant matches the reference", flush=True)


def best(fn_of_cfg, configs, weights):
    from tritongen.ops.triton_gemv import graph_time_us

    out = None
    for cfg in configs:
        try:
            us = graph_time_us(lambda w, c=cfg: fn_of_cfg(w, c), weights)
        except Exception as exc:  # noqa: BLE001 - a configuration that does not fit this GPU
            print(f"    {cfg}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            continue
        if out is None or us < out[0]:
            out = (us, cfg)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,8,16")
    ap.add_argument("--shapes", default="7b")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    check(device)
    if args.check or device == "cpu":
        return 0
    import torch.nn.functional as F

    from tritongen.ops import triton_fp8, triton_fp8_quant, triton_gemv
    from tritongen.ops.triton_gemv import graph_time_us

    table = []
    ch = Fp8Scales("channel")
    for model in args.shapes.split(","):
        for name, n, k in SHAPES[model]:
            copies = max(4, -(-(256 << 20) // (n * k)))
            dense = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
            fp8 = [quantize_weight(w, ch) for w in dense]
            fp8_w = list(range(copies))
            for rows in (int(r) for r in args.rows.split(",")):
                x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
                xq, xs = triton_fp8_quant.quantize_tokens(x)
                res = {}
                res["cuBLAS bf16"] = (graph_time_us(lambda w: F.linear(x, w), dense), None)
                res["skinny bf16"] = best(lambda w, c: triton_gemv.skinny_linear(x, w, **c),
                                          triton_gemv.candidates(torch.bfloat16), dense)
                res["current fp8"] = best(
                    lambda i, c: triton_fp8.fp8_linear(x, fp8[i][0], fp8[i][1], ch, None, c),
                    triton_fp8.candidates(ch, k), fp8_w)
                splits = (1, 2, 4) if n <= 8192 else (1,)
                res["swap fp8"] = best(lambda i, c: swap_linear(x, fp8[i][0], fp8[i][1], **c), swap_configs(splits),
                                       fp8_w)
                res["swap8 fp8"] = best(
                    lambda i, c: triton_fp8.fp8_tokens_linear(xq, xs, fp8[i][0], fp8[i][1], ch, None, c, x.dtype),
                    triton_fp8.TOKEN_CONFIGS, fp8_w)
                res["quant x"] = (graph_time_us(lambda w: triton_fp8_quant.quantize_tokens(x), [0]), None)
                for variant, r in res.items():
                    if r is None:
                        continue
                    us, cfg = r
                    nbytes = n * k * (2 if "bf16" in variant else 1) if variant != "quant x" else rows * k * 3
                    print(f"{model} {name:<8} {n}x{k} rows={rows:<3} {variant:<12} {us:8.1f} us "
                          f"{nbytes / us / 1e6:5.2f} TB/s {cfg or ''}", flush=True)
                table.append((f"{model} {name} rows={rows}", {v: r[0] for v, r in res.items() if r}))
    variants = list(table[0][1])
    print("\n" + f"{'shape':<24}" + "".join(f"{v:>13}" for v in variants))
    for label, times in table:
        print(f"{label:<24}" + "".join(f"{times.get(v, float('nan')):>13.1f}" for v in variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
