"""The symmetric-memory all-reduce paths of tensor parallelism on two GPUs (and on one, with no
peer): the fused all-reduce + residual add + RMSNorm kernels, flag and Lamport protocols (bit-equal
residual stream to summing the partials in float32, rounding once, and adding) over several calls
and both buffer halves, the load-time choice between them, and the two-shot path."""
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("world", [1, 2])
def test_fused_and_two_shot_all_reduce(tmp_path, world: int) -> None:
    """world 1: one GPU runs the same paths (the load-time measurement included) with no peer."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA devices")
    pytest.importorskip("triton")
    sys.path.insert(0, str(Path(__file__).parent))
    import symm_worker
    from tritongen.netutil import free_ports

    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parents[2] / "src"), str(Path(__file__).parent),
                    os.environ.get("PYTHONPATH")) if p)
    ctx = mp.get_context("spawn")
    port = free_ports(1)[0]
    procs = [ctx.Process(target=symm_worker.rank_main, args=(r, world, port, str(tmp_path))) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        if p.is_alive():
            p.kill()
    errors = [f.read_text() for f in tmp_path.glob("rank*.err")]
    assert not errors, "\n".join(errors)
    for f in sorted(tmp_path.glob("rank*.ok")):
        print(f.read_text())
    assert [p.exitcode for p in procs] == [0] * world
