"""Latency of the all-reduce that tensor parallelism issues twice per layer: NCCL against
PyTorch's symmetric-memory one-shot / two-shot all-reduce (NVLink P2P loads, no multicast), and
what follows a row-parallel layer: two-shot + the residual add + RMSNorm kernel against the fused
all-reduce + add + RMSNorm kernel (parallel.symmetric, ops/triton_allreduce.py; `lamport`: the same
with ops/triton_lamport.py's one-trip protocol, up to 128 rows). Each is captured
in a CUDA graph of `--reps` back-to-back calls, as the decode graphs run them.

With `--gemm-k K` (rows <= 16) the row-parallel GEMM joins in: x [rows, K] @ W [hidden, K].T (8
weights cycled, beyond L2) by cuBLAS or the skinny GEMM, then the fused all-reduce kernel.

    PYTHONPATH=$PWD/src python3 benchmarks/probes/allreduce_probe.py --hidden 5120 --rows 1,8,32,128,512
    PYTHONPATH=$PWD/src python3 benchmarks/probes/allreduce_probe.py --rows 1,2,4,8,16 --gemm-k 2560 --no-plain
    PYTHONPATH=$PWD/src python3 benchmarks/probes/allreduce_probe.py --rows 256,512 --no-plain --module old.py

Prints microseconds per all-reduce and whether each method gave the right sum (the fused kernel:
the same residual stream as summing in float32, rounding once and adding).
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist


def _time_graph(fn, reps: int, iters: int = 20) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (iters * reps)


def _plain_cases(x: torch.Tensor, rows: int, buf: torch.Tensor, group_name: str, want: torch.Tensor) -> list:
    """(name, fn, result, want) of NCCL's all-reduce and torch's one-shot / two-shot kernels."""
    out = torch.empty_like(x)
    y = x.clone()

    def nccl() -> None:
        y.copy_(x)
        dist.all_reduce(y)

    def one_shot() -> None:
        torch.ops.symm_mem.one_shot_all_reduce_copy_out(buf[:rows], x, "sum", group_name, out) \
            if hasattr(torch.ops.symm_mem, "one_shot_all_reduce_copy_out") else \
            out.copy_(torch.ops.symm_mem.one_shot_all_reduce_copy(buf[:rows], x, "sum", group_name))

    def two_shot() -> None:
        buf[:rows].copy_(x)
        torch.ops.symm_mem.two_shot_all_reduce_(buf[:rows], "sum", group_name)

    return [("nccl", nccl, lambda: y, want), ("one_shot", one_shot, lambda: out, want),
            ("two_shot", two_shot, lambda: buf[:rows], want)]


def _norm_cases(sym, x: torch.Tensor, rows: int, hidden: int, group_name: str, buf: torch.Tensor,
                want: torch.Tensor) -> list:
    """(name, fn, result) of two-shot + add + RMSNorm and of the fused kernel, with the flag handshake
    (`fused`) and, up to its rows, the Lamport protocol (`lamport`), whatever the load-time choice;
    results: the residual stream (sum + residual), compared against want + residual."""
    from tritongen.ops import kernels

    residual = torch.ones(rows, hidden, dtype=torch.bfloat16, device=x.device)
    weight = torch.ones(hidden, dtype=torch.bfloat16, device=x.device)
    outs: dict[str, torch.Tensor] = {}
    calls = [0]  # the fused path alternates buffer halves, as o_proj / down_proj do (no end barrier)

    def two_shot_norm() -> None:
        buf[:rows].copy_(x)
        torch.ops.symm_mem.two_shot_all_reduce_(buf[:rows], "sum", group_name)
        outs["two_shot+norm"] = kernels.add_rms_norm(buf[:rows], residual, weight, 1e-5)[1]

    def fused(name: str = "fused", lamport_rows: int = 0) -> None:
        calls[0] += 1
        sym.peers.lamport_rows = lamport_rows  # the protocol reduce_add_rms_norm dispatches to
        part = sym.partial(calls[0] % 2, rows, hidden)
        part.copy_(x)
        outs[name] = sym.reduce_add_rms_norm(part, residual, weight, 1e-5)[1]

    cases = [("two_shot+norm", two_shot_norm), ("fused", fused)]
    if sym.peers.lamport_epoch is not None and rows <= sym.peers.lamport_epoch.numel():
        cases.append(("lamport", lambda: fused("lamport", rows)))
    return [(name, fn, lambda name=name: outs[name] - 1, want) for name, fn in cases]


def _gemm_cases(sym, rows: int, hidden: int, k: int, rank: int) -> list:
    """(name, fn, result, want) of the row-parallel GEMM (cuBLAS / skinny) then the fused all-reduce;
    results: the residual stream (not checked: the point is the time)."""
    from tritongen.ops.triton_gemv import skinny_linear

    dev = torch.device("cuda", rank)
    gen = torch.Generator(device=dev).manual_seed(rank)
    weights = [torch.randn(hidden, k, device=dev, dtype=torch.bfloat16, generator=gen) / k ** 0.5 for _ in range(8)]
    x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16, generator=gen)
    residual = torch.zeros(rows, hidden, dtype=torch.bfloat16, device=dev)
    norm_weight = torch.ones(hidden, dtype=torch.bfloat16, device=dev)
    cfg = dict(block_n=32, block_k=256, num_warps=4, num_stages=5)
    outs: dict[str, torch.Tensor] = {}
    calls = [0]
    sym.peers.lamport_rows = 0  # the flag handshake after the GEMMs

    def unfused(name: str, gemm) -> None:
        calls[0] += 1
        part = sym.partial(calls[0] % 2, rows, hidden)
        gemm(x, weights[calls[0] % len(weights)], part)
        outs[name] = sym.reduce_add_rms_norm(part, residual, norm_weight, 1e-5)[1]

    def cublas(name="cublas+fused"):
        unfused(name, lambda a, w, out: torch.mm(a, w.t(), out=out))

    def skinny(name="skinny+fused"):
        unfused(name, lambda a, w, out: skinny_linear(a, w, **cfg, out=out))

    return [("cublas+fused", cublas, lambda: outs["cublas+fused"].float(), None),
            ("skinny+fused", skinny, lambda: outs["skinny+fused"].float(), None)]


def _worker(rank: int, world: int, args: argparse.Namespace, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    if args.module:
        _use_module(args.module)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    import torch.distributed._symmetric_memory as symm_mem

    group_name = dist.group.WORLD.group_name
    max_rows = max(args.rows)
    buf = symm_mem.empty((max_rows, args.hidden), dtype=torch.bfloat16, device=f"cuda:{rank}")
    symm_mem.rendezvous(buf, group_name)
    from tritongen.ops import kernels
    from tritongen.parallel.symmetric import SymmetricAllReduce

    kernels.use_triton(True)  # the process default: the add + RMSNorm kernel of `two_shot+norm`
    sym = SymmetricAllReduce.create(torch.bfloat16, torch.device("cuda", rank), hidden=args.hidden,
                                    fused_rows=max_rows) if args.fused else None
    rows_out = []
    for rows in args.rows:
        # Small integers: every partial sum is exact in bf16, so the check is exact too.
        base = (torch.arange(rows * args.hidden, device="cuda") % 7 - 3).view(rows, args.hidden).float()
        x = (base * (rank + 1)).to(torch.bfloat16)
        want = base * sum(range(1, world + 1))
        result = {}
        cases = _plain_cases(x, rows, buf, group_name, want) if args.plain else []
        if sym is not None:
            cases += _norm_cases(sym, x, rows, args.hidden, group_name, buf, want)
            if args.gemm_k and rows <= 16:
                cases += _gemm_cases(sym, rows, args.hidden, args.gemm_k, rank)
        for name, fn, res, expect in cases:
            try:
                fn()
                torch.cuda.synchronize()
                expect = expect() if callable(expect) else expect
                err = 0.0 if expect is None else (res().float() - expect).abs().max().item()
                us = _time_graph(fn, args.reps)
                result[name] = f"{us:7.1f} us{'' if err == 0 else f' WRONG {err:.3g}'}"
            except Exception as exc:  # noqa: BLE001 - a probe: report and go on
                result[name] = f"failed: {type(exc).__name__}: {str(exc)[:120]}"
        rows_out.append((rows, result))
    if rank == 0:
        print(f"all-reduce of [rows, {args.hidden}] bf16 over {world} GPUs, {args.reps} per CUDA graph")
        for rows, result in rows_out:
            print(f"rows {rows:4d}: " + " | ".join(f"{k} {v}" for k, v in result.items()), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def _use_module(path: str) -> None:
    """Make `path` what `from tritongen.ops import triton_allreduce` finds (parallel.symmetric's import)."""
    import importlib.util
    import sys

    import tritongen.ops

    spec = importlib.util.spec_from_file_location("tritongen.ops.triton_allreduce", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules["tritongen.ops.triton_allreduce"] = mod
    tritongen.ops.triton_allreduce = mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--rows", default="1,8,32,128,512")
    ap.add_argument("--reps", type=int, default=80)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--no-fused", dest="fused", action="store_false",
                    help="leave out the fused all-reduce + add + RMSNorm comparison")
    ap.add_argument("--no-plain", dest="plain", action="store_false",
                    help="leave out NCCL / one-shot / two-shot on their own")
    ap.add_argument("--gemm-k", type=int, default=0,
                    help="also time the row-parallel GEMM [rows, K] x [K, hidden] before the fused kernel "
                         "(rows <= 16)")
    ap.add_argument("--module", default=None,
                    help="another copy of ops/triton_allreduce.py for the fused kernels (e.g. an older one)")
    args = ap.parse_args()
    args.rows = [int(r) for r in args.rows.split(",")]
    from tritongen.netutil import free_ports

    torch.multiprocessing.spawn(_worker, args=(args.world, args, free_ports(1)[0]), nprocs=args.world)


if __name__ == "__main__":
    main()
