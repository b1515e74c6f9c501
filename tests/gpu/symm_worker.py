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
