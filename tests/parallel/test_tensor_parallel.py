"""Tensor parallelism on CPU: two gloo ranks in spawned processes against the unsharded model.

One spawn runs every case (starting processes costs more than the tiny models); the tests then
read what each rank returned. Ranks exchange partial sums, so they agree with the single-device
model up to float32 summation order, not bit for bit.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import tp_worker
from tritongen.config import ParallelConfig
from tritongen.models.arch import ModelArch
from tritongen.models.presets import PRESETS
from tritongen.parallel.tensor_parallel import kv_heads_per_rank, shard_model, validate_tensor_parallel

WORLD_SIZE = 2
ATOL = 1e-4
JOIN_TIMEOUT_S = 50
SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory) -> list[dict]:
    """[{case: (logits, kv cache shape)} of rank 0, of rank 1]."""
    out = tmp_path_factory.mktemp("tp")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=tp_worker.rank_main, args=(r, WORLD_SIZE, str(out / "init"), str(out)))
             for r in range(WORLD_SIZE)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(JOIN_TIMEOUT_S)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
    errors = [(out / f"rank{r}.err").read_text() for r in range(WORLD_SIZE) if (out / f"rank{r}.err").exists()]
    assert not errors, "a rank failed:\n" + "\n".join(errors)
    assert [p.exitcode for p in procs] == [0] * WORLD_SIZE, "ranks did not finish in time"
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD_SIZE)]


@pytest.mark.parametrize("name", list(tp_worker.CASES))
def test_two_ranks_match_unsharded(rank_results, name: str) -> None:
    net, arch = tp_worker.build(name)
    expected = tp_worker.run_steps(net, arch)
    (rank0, shape0), (rank1, shape1) = rank_results[0][name], rank_results[1][name]
    assert rank0.shape == expected.shape == (15 + 2 + 2, arch.vocab_size)
    torch.testing.assert_close(rank0, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(rank1, rank0, atol=ATOL, rtol=0)
    kv_heads = kv_heads_per_rank(arch, WORLD_SIZE)
    assert shape0 == shape1 == (2, tp_worker.NUM_BLOCKS, tp_worker.BLOCK_SIZE, kv_heads, arch.head_dim)


def test_kv_heads_per_rank() -> None:
    gqa = ModelArch.from_hf_config(PRESETS["tiny-llama"])  # 4 q heads, 2 kv heads
    assert [kv_heads_per_rank(gqa, w) for w in (1, 2, 4)] == [2, 1, 1]
    mha = ModelArch.from_hf_config(PRESETS["tiny-llama-mha"])
    assert [kv_heads_per_rank(mha, w) for w in (1, 2, 4)] == [4, 2, 1]


def test_world_size_one_is_the_identity() -> None:
    net, arch = tp_worker.build("tiny-qwen2")
    expected = tp_worker.run_steps(net, arch)
    shard_model(net, rank=0, world_size=1)
    torch.testing.assert_close(tp_worker.run_steps(net, arch), expected, atol=0, rtol=0)


def _arch(**changes) -> ModelArch:
    return dataclasses.replace(ModelArch.from_hf_config(PRESETS["tiny-llama"]), **changes)


@pytest.mark.parametrize("changes, world_size, message", [
    ({}, 3, "num_attention_heads 4 is not divisible by tensor parallel world_size 3"),
    ({}, 8, "world_size 8 is larger than num_attention_heads 4"),
    ({}, 0, "world_size must be >= 1"),
    ({"num_attention_heads": 6, "num_key_value_heads": 3}, 2, "num_key_value_heads 3 is not divisible"),
    ({"num_attention_heads": 12, "num_key_value_heads": 3}, 4, "not a multiple of num_key_value_heads 3"),
    ({"intermediate_size": 130}, 4, "intermediate_size 130 is not divisible"),
])
def test_unshardable_configs_are_refused(changes: dict, world_size: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_tensor_parallel(_arch(**changes), world_size)


def test_shard_model_errors() -> None:
    net, _ = tp_worker.build("tiny-llama")
    with pytest.raises(ValueError, match="rank 2 is outside"):
        shard_model(net, rank=2, world_size=2)
    with pytest.raises(ValueError, match="torch.distributed initialized"):
        shard_model(net, rank=0, world_size=2)
    net.fuse_projections()
    with pytest.raises(ValueError, match="before fuse_projections"):
        shard_model(net, rank=0, world_size=1)


def test_symmetric_buffer_views_and_when_it_is_wanted() -> None:
    from tritongen.parallel import symmetric

    sym = symmetric.SymmetricAllReduce(torch.zeros(12), "g")
    assert sym.output(3, 4).shape == (3, 4) and sym.output(3, 4).data_ptr() == sym.buf.data_ptr()
    assert sym.output(4, 4) is None and sym.output(0, 4) is None  # too large; empty
    assert not symmetric.wanted(torch.device("cpu"), 2)
    assert not symmetric.wanted(torch.device("cuda", 0), 1)
    assert symmetric.wanted(torch.device("cuda", 0), 2)
    assert sym.timeout_s == symmetric.DEFAULT_TIMEOUT_S == ParallelConfig().tp_timeout_s


def test_the_shard_takes_the_all_reduce_options_from_the_parallel_config() -> None:
    from tritongen.parallel.tensor_parallel import Shard

    assert Shard(0, 2).custom_all_reduce
    shard = Shard(1, 2, config=ParallelConfig(disable_custom_all_reduce=True, tp_timeout_s=5.0))
    assert not shard.custom_all_reduce and shard.config.tp_timeout_s == 5.0


def test_linear_into_an_output_buffer() -> None:
    from tritongen.ops import kernels

    gen = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=gen) for s in ((3, 8), (5, 8), (5,)))
    out = torch.full((3, 5), float("nan"))
    assert kernels.linear(x, w, out=out).data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, x @ w.T)
    kernels.linear(x, w, b, out=out)
    torch.testing.assert_close(out, x @ w.T + b)


def test_fused_partial_sums_must_be_reduced_by_the_next_norm() -> None:
    from tritongen.parallel import symmetric

    hidden, max_rows = 4, 32
    sym = symmetric.SymmetricAllReduce(torch.zeros(8), "g", torch.zeros(2, max_rows, hidden))
    assert sym.output(2, 4).data_ptr() == sym.buf.data_ptr() and sym.output(3, 4) is None  # 8 two-shot elements
    assert sym.partial(0, max_rows + 1, hidden) is None and sym.partial(0, 1, 5) is None
    first = sym.partial(0, 2, hidden)
    assert first.shape == (2, hidden) and first.data_ptr() == sym.fused.data_ptr()
    with pytest.raises(RuntimeError, match="never reduced"):
        sym.partial(1, 2, hidden)
    with pytest.raises(RuntimeError, match="another tensor"):
        sym.is_pending(torch.zeros(2, hidden))
    assert sym.is_pending(first.view(1, 2, hidden))
    sym._pending = None
    second = sym.partial(1, 2, hidden)
    assert second.data_ptr() == sym.fused[1].data_ptr()


def test_lamport_kernel_serves_the_batch_sizes_where_it_was_measured_faster() -> None:
    from tritongen.parallel.calibrate import LAMPORT_MIN_GAIN, lamport_rows

    rows = [1, 16, 64, 128]
    flags = [7.0, 8.0, 10.0, 14.0]
    assert lamport_rows(rows, flags, [4.0, 5.0, 9.0, 13.0], True) == 128
    assert lamport_rows(rows, flags, [4.0, 5.0, 10.0, 13.0], True) == 16  # no gain at 64: none above either
    assert lamport_rows(rows, flags, [8.0, 5.0, 9.0, 13.0], True) == 0  # slower from the first size on
    assert lamport_rows(rows, flags, [7.0 * LAMPORT_MIN_GAIN, 9.0, 9.0, 9.0], True) == 1  # the margin itself
    assert lamport_rows(rows, flags, [1.0, 1.0, 1.0, 1.0], False) == 0  # results differed: never
    assert lamport_rows([], [], [], True) == 0


def test_lamport_dispatch_by_rows(monkeypatch) -> None:
    from tritongen.ops import triton_allreduce, triton_lamport
    from tritongen.parallel import symmetric

    hidden = 4
    zeros = torch.zeros(4, dtype=torch.int32)
    peers = symmetric.Peers(0, zeros.long(), zeros.long(), zeros, inbox=64, lamport_epoch=zeros.clone(),
                            lamport_rows=2)
    sym = symmetric.SymmetricAllReduce(torch.zeros(8), "g", torch.zeros(2, 8, hidden), peers)
    seen = []
    monkeypatch.setattr(triton_lamport, "lamport_add_rms_norm", lambda *a, **k: seen.append(("lamport", a[5])))
    monkeypatch.setattr(triton_allreduce, "allreduce_add_rms_norm", lambda *a, **k: seen.append(("flags", a[4])))
    for rows in (1, 2, 3, 8):
        part = sym.partial(rows % 2, rows, hidden)
        sym.reduce_add_rms_norm(part, part, torch.ones(hidden), 1e-6)
    assert seen == [("lamport", 1), ("lamport", 2), ("flags", 3), ("flags", 8)]
