"""Tensor parallelism of every family on CPU: two gloo ranks give TP=1's greedy tokens.

Each family's tiny checkpoint is written in its own HF layout, so every rank goes through the
model's checkpoint_tensors (Conv1D transposes, fused qkv / W_pack / gate_up splits, expert stacks)
and the plan's slices; one spawn runs every family (starting processes costs more than the tiny
models). Two families also run through the whole engine (dummy weights drawn whole and sliced,
chunked prefill, the worker process of tp_runner).

Tolerance: the ranks sum partial products (two halves of each row-parallel GEMM, then an all-reduce)
in another order than one rank does. float32 rounds at 6e-8 relative; over 2-4 layers of width
48-128 that leaves the last hidden state off by ~1e-6 of its size, and a logprob scales it by the
spread of the logits (a few units, Gemma's softcaps less): ~1e-5 at worst. 1e-4 leaves room for
thread-count effects; a wrong slice (a rank with another rank's ALiBi slopes, a gate row paired
with the wrong up row, a bias added twice) moves logprobs by 1e-2 or more, and the tokens must
match exactly anyway.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import tp_family_worker as worker
from tritongen.entrypoints.llm import LLM
from tritongen.models.loader import load_model, read_arch
from tritongen.parallel.tensor_parallel import kv_heads_per_rank, shard_model, validate_tensor_parallel
from tritongen.parallel.tp_plans import PLANS
from tritongen.types import SamplingParams

WORLD_SIZE = 2
LOGPROB_ATOL = 1e-4
JOIN_TIMEOUT_S = 150
SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tp-families")
    for preset in worker.FAMILIES:
        worker.write_checkpoint(preset, root / preset)
    return root


@pytest.fixture(scope="module")
def rank_results(checkpoints: Path, tmp_path_factory) -> list[dict]:
    """[{preset: (ids, logprobs, kv cache shape)} of rank 0, of rank 1]."""
    out = tmp_path_factory.mktemp("tp-ranks")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker.rank_main, args=(r, WORLD_SIZE, str(out / "init"), str(checkpoints), str(out)))
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


def test_every_family_has_a_plan() -> None:
    from tritongen.models.arch import SUPPORTED_ARCHITECTURES

    assert set(PLANS) == set(SUPPORTED_ARCHITECTURES)
    tested = {read_arch(f"dummy:{p}").architecture for p in worker.FAMILIES}
    assert set(PLANS) - tested == {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}  # test_tensor_parallel


@pytest.mark.parametrize("preset", list(worker.FAMILIES))
def test_tp2_greedy_equals_tp1(checkpoints: Path, rank_results: list[dict], preset: str) -> None:
    net, arch = load_model(str(checkpoints / preset), torch.float32, worker.CPU)
    ids, logprobs = worker.greedy(net)
    assert len(set(map(tuple, ids))) > 1  # the prompts lead different ways: a mixed-up row would show
    kv_heads = kv_heads_per_rank(arch, WORLD_SIZE)
    assert kv_heads < arch.num_key_value_heads or arch.num_key_value_heads == 1
    for rank, results in enumerate(rank_results):
        rank_ids, rank_logprobs, shape = results[preset]
        assert rank_ids == ids, (preset, rank)
        torch.testing.assert_close(rank_logprobs, logprobs, atol=LOGPROB_ATOL, rtol=0)
        assert shape == (2, 1, worker.BLOCK_SIZE, kv_heads, arch.head_dim)


ENGINE = dict(num_blocks=64, block_size=4, max_num_batched_tokens=16, max_num_seqs=4)
"""A 16-token budget: the 25- and 41-token prompts prefill in chunks at both sizes."""


@pytest.mark.parametrize("preset", ["tiny-bloom", "tiny-qwen3-moe"])  # ALiBi slopes per rank; experts split
def test_engine_tp2_equals_tp1(preset: str) -> None:
    prompts = worker.prompts(read_arch(f"dummy:{preset}").vocab_size)[:3] + [list(range(300, 341))]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=0)
    outs = {}
    for tp in (1, 2):
        with LLM(f"dummy:{preset}", tensor_parallel_size=tp, dtype="float32", device="cpu", **ENGINE) as llm:
            outs[tp] = llm.generate(prompts, params)
    assert [o.token_ids for o in outs[2]] == [o.token_ids for o in outs[1]]
    for single, split in zip(outs[1], outs[2]):
        assert len(single.token_ids) == params.max_tokens
        torch.testing.assert_close(torch.tensor([lp.logprob for lp in split.logprobs]),
                                   torch.tensor([lp.logprob for lp in single.logprobs]), atol=LOGPROB_ATOL, rtol=0)


@pytest.mark.parametrize("preset, changes, world_size, message", [
    ("tiny-gemma2", {"num_attention_heads": 6, "num_key_value_heads": 3}, 2,
     "num_key_value_heads 3 is not divisible by tensor parallel world_size 2"),
    ("tiny-bloom", {}, 4, "num_attention_heads 6 is not divisible by tensor parallel world_size 4"),
    ("tiny-gpt2", {}, 8, "world_size 8 is larger than num_attention_heads 4"),
    ("tiny-phi3", {"num_attention_heads": 12, "num_key_value_heads": 3}, 4,
     "world_size 4 is not a multiple of num_key_value_heads 3"),
    ("tiny-qwen3-moe", {"moe_intermediate_size": 50}, 4,
     r"moe_intermediate_size 50 \(each expert's\) is not divisible by tensor parallel world_size 4"),
    ("tiny-qwen3-moe", {"intermediate_size": 130}, 4, "intermediate_size 130 is not divisible"),  # its dense layer
    ("tiny-baichuan", {"architecture": "FooForCausalLM"}, 2, "no sharding plan for FooForCausalLM"),
])
def test_unshardable_configs_are_refused(preset: str, changes: dict, world_size: int, message: str) -> None:
    arch = dataclasses.replace(read_arch(f"dummy:{preset}"), **changes)
    with pytest.raises(ValueError, match=message):
        validate_tensor_parallel(arch, world_size)


def test_what_only_the_dense_layers_need_does_not_refuse_an_all_moe_model() -> None:
    validate_tensor_parallel(dataclasses.replace(read_arch("dummy:tiny-mixtral"), intermediate_size=130), 4)


def test_the_engine_refuses_an_unshardable_family_config_before_starting_workers() -> None:
    with pytest.raises(ValueError, match="num_attention_heads 6 is not divisible by tensor parallel world_size 4"):
        LLM("dummy:tiny-bloom", tensor_parallel_size=4, num_blocks=16)


def test_a_plan_that_forgets_a_projection_is_refused(monkeypatch) -> None:
    plan = PLANS["GPT2LMHeadModel"]
    column = {k: v for k, v in plan.column.items() if k != "mlp.c_fc"}
    monkeypatch.setitem(PLANS, "GPT2LMHeadModel", dataclasses.replace(plan, column=column))
    net, _ = load_model("dummy:tiny-gpt2", torch.float32, worker.CPU)
    with pytest.raises(ValueError, match=r"neither splits nor replicates \['transformer.h.0.mlp.c_fc.weight'"):
        shard_model(net, rank=0, world_size=1)
    monkeypatch.setitem(PLANS, "GPT2LMHeadModel", dataclasses.replace(plan, row={**plan.row, "mlp.c_out": "mlp"}))
    net, _ = load_model("dummy:tiny-gpt2", torch.float32, worker.CPU)
    with pytest.raises(ValueError, match=r"names modules no layer has: \['mlp.c_out'\]"):
        shard_model(net, rank=0, world_size=1)
