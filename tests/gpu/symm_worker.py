"""The rank process of test_symmetric_allreduce (a module of its own: spawned processes import it
by name). Each rank writes partial sums into the symmetric buffer as the row-parallel layers do and
checks the fused all-reduce + residual add + RMSNorm, and the two-shot path, against torch."""
from __future__ import annotations

import os
import time
import traceback

import torch
import torch.distributed as dist


def rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
        from tritongen.ops import reference
        from tritongen.parallel.symmetric import SymmetricAllReduce

        hidden, lines = 5120, []
        started = time.perf_counter()
        sym = SymmetricAllReduce.create(torch.bfloat16, device, hidden=hidden, fused_rows=512)
        created_s = time.perf_counter() - started
        assert sym is not None and sym.peers is not None, "symmetric memory unavailable"
        lines.append(f"rank {rank}: buf {sym.buf.data_ptr():#x} ptrs {[hex(p) for p in sym.peers.buf_ptrs.tolist()]} "
                     f"flag ptrs {[hex(p) for p in sym.peers.flag_ptrs.tolist()]}")
        print(lines[-1], flush=True)
        assert sym.peers.lamport_epoch is not None, "no Lamport inboxes in the default (measuring) mode"
        lines.append(f"rank {rank}: the load-time measurement gave the Lamport kernel {sym.peers.lamport_rows} rows "
                     f"(created in {created_s:.1f} s)")
        gen = torch.Generator().manual_seed(0)
        weight = torch.randn(hidden, generator=gen).to(device, torch.bfloat16)
        steps = [(lamport, rows) for lamport in (0, 128, 0) for rows in (1, 3, 128, 1, 7, 300, 512)]
        for step, (lamport, rows) in enumerate(steps):  # one row per program, and loops; both protocols, mixed
            sym.peers.lamport_rows = lamport
            parts = [torch.randn(rows, hidden, generator=gen).to(device, torch.bfloat16) for _ in range(world)]
            residual = torch.randn(rows, hidden, generator=gen).to(device, torch.bfloat16)
            half = step % 2
            part = sym.partial(half, rows, hidden)
            part.copy_(parts[rank])
            got_h, got_s = sym.reduce_add_rms_norm(part, residual, weight, 1e-5)
            total = parts[0].float()
            for p in parts[1:]:
                total += p.float()
            want_h, want_s = reference.add_rms_norm(total.to(torch.bfloat16), residual, weight, 1e-5)
            torch.cuda.synchronize()
            assert torch.equal(got_s, want_s), f"rows {rows}: residual differs by {(got_s.float() - want_s.float()).abs().max()}"
            torch.testing.assert_close(got_h, want_h, atol=2e-2, rtol=2e-2)
        lines.append(f"rank {rank}: fused ok, epochs {sym.peers.epoch[:8].tolist()}")
        lines.append(_gemm_in_the_same_launch(sym, rank, world, weight, gen))
        out = sym.output(256, hidden)
        out.copy_(torch.full((256, hidden), float(rank + 1), device=device))
        sym.all_reduce_(out)
        assert torch.equal(out, torch.full_like(out, float(world * (world + 1) // 2))), "two-shot sum"
        with open(os.path.join(out_dir, f"rank{rank}.ok"), "w") as f:
            f.write("\n".join(lines))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise


def _gemm_in_the_same_launch(sym, rank: int, world: int, weight: torch.Tensor, gen: torch.Generator) -> str:
    """The GEMM + all-reduce kernel, eagerly and replayed in a CUDA graph, interleaved with the
    all-reduce kernel (both use epoch slot 0): the same as the ranks' skinny GEMMs summed."""
    from tritongen.ops import reference
    from tritongen.ops.triton_allreduce import gemm_allreduce_add_rms_norm
    from tritongen.ops.triton_gemv import skinny_linear

    device, hidden, k = weight.device, weight.shape[0], 2560
    cfg = dict(block_n=32, block_k=256, num_warps=4, num_stages=5)
    shards = [(torch.randn(hidden, k, generator=gen) / k ** 0.5).to(device, torch.bfloat16) for _ in range(world)]
    p = sym.peers

    def step(i: int, x: list, residual: torch.Tensor):
        half = i % 2
        if i % 3 == 2:  # every third call through the all-reduce kernel, its GEMM run apart
            part = sym.partial(half, x[rank].shape[0], hidden)
            skinny_linear(x[rank], shards[rank], **cfg, out=part)
            return sym.reduce_add_rms_norm(part, residual, weight, 1e-5)
        return gemm_allreduce_add_rms_norm(x[rank], shards[rank], cfg, p.buf_ptrs, p.flag_ptrs, p.epoch, p.count,
                                           half * sym.fused.shape[1] * hidden, residual, weight, 1e-5, rank)

    def want(x: list, residual: torch.Tensor):
        total = sum(skinny_linear(x[r], shards[r], **cfg).float() for r in range(world))
        return reference.add_rms_norm(total.to(torch.bfloat16), residual, weight, 1e-5)

    cases = [([torch.randn(rows, k, generator=gen).to(device, torch.bfloat16) for _ in range(world)],
              torch.randn(rows, hidden, generator=gen).to(device, torch.bfloat16)) for rows in (1, 4, 16, 2, 1, 8)]
    for i, (x, residual) in enumerate(cases):
        got_h, got_s = step(i, x, residual)
        want_h, want_s = want(x, residual)
        assert torch.equal(got_s, want_s), f"gemm+all-reduce call {i}: residual differs"
        torch.testing.assert_close(got_h, want_h, atol=2e-2, rtol=2e-2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [step(i, x, residual) for i, (x, residual) in enumerate(cases)]
    for _ in range(3):
        for x, residual in cases:  # new inputs in place, then replay
            for t in (*x, residual):
                t.copy_(torch.randn(t.shape, generator=gen).to(device, torch.bfloat16))
        graph.replay()
        for (got_h, got_s), (x, residual) in zip(outs, cases):
            want_h, want_s = want(x, residual)
            assert torch.equal(got_s, want_s), "gemm+all-reduce in a CUDA graph: residual differs"
            torch.testing.assert_close(got_h, want_h, atol=2e-2, rtol=2e-2)
    torch.cuda.synchronize()
    assert p.count.item() == 0, "the program counter is not back at zero"
    return f"rank {rank}: gemm + all-reduce ok (eager and 3 graph replays), epochs {p.epoch[:4].tolist()}"
