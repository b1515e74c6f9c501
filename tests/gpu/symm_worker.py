"""The rank process of test_symmetric_allreduce (a module of its own: spawned processes import it
by name). Each rank writes its partial sums into the symmetric buffer, as the row-parallel layers
do, and checks the in-place two-shot sum over a few decode and prefill-chunk sizes."""
from __future__ import annotations

import os
import traceback

import torch
import torch.distributed as dist


def rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
        from tritongen.parallel.symmetric import SymmetricAllReduce

        hidden = 5120
        sym = SymmetricAllReduce.create(torch.bfloat16, device)
        assert sym is not None, "symmetric memory unavailable"
        assert sym.output(sym.buf.numel() // hidden + 1, hidden) is None  # too large: NCCL's
        for rows in (1, 3, 256, 512, 1500):
            # Small integers: every partial sum is exact in bf16, so the check is exact too.
            base = (torch.arange(rows * hidden, device=device) % 7 - 3).view(rows, hidden).float()
            out = sym.output(rows, hidden)
            out.copy_(base * (rank + 1))
            got = sym.all_reduce_(out)
            assert got.data_ptr() == out.data_ptr()
            want = base * sum(range(1, world + 1))
            assert torch.equal(got.float(), want), f"rows {rows}: off by {(got.float() - want).abs().max()}"
        with open(os.path.join(out_dir, f"rank{rank}.ok"), "w") as f:
            f.write(f"rank {rank}: two-shot sums right")
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise
