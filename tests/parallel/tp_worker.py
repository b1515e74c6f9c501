"""Helpers of test_tensor_parallel: the tiny models, the forward passes, and the rank process.

A module of its own (not the test file) because spawned processes import the worker by module
name, and pytest's importlib mode gives test files names that a fresh process cannot import.
"""
from __future__ import annotations

import copy
import os
import traceback

import torch

from tritongen.models.arch import ModelArch
from tritongen.models.loader import build_empty_model, init_dummy_weights, load_model
from tritongen.models.presets import PRESETS
from tritongen.ops.attention import build_attention_metadata
from tritongen.parallel.symmetric import SymmetricAllReduce

BLOCK_SIZE = 4
NUM_BLOCKS = 16
CPU = torch.device("cpu")


def _derived(name: str, **overrides) -> dict:
    d = copy.deepcopy(PRESETS[name])
    d.update(overrides)
    return d


# name -> (HF config, fuse_projections after sharding)
CASES: dict[str, tuple[dict, bool]] = {
    "tiny-llama": (PRESETS["tiny-llama"], False),  # GQA 4 q / 2 kv: one KV head per rank
    "tiny-llama-mha": (PRESETS["tiny-llama-mha"], False),  # MHA, tied embeddings
    "tiny-qwen2": (PRESETS["tiny-qwen2"], False),  # q/k/v bias, tied embeddings
    "tiny-qwen3": (PRESETS["tiny-qwen3"], False),  # qk-norm weights kept whole on every rank
    "tiny-llama-kv1": (_derived("tiny-llama", num_key_value_heads=1), False),  # KV head replicated
    # o_proj and down_proj biases (added once after the reduce), fused GEMMs over the shards.
    "tiny-llama-bias": (_derived("tiny-llama", attention_bias=True, mlp_bias=True), True),
    # With the row-parallel GEMMs writing into a shared output buffer (BufferAllReduce): biases
    # (added after an in-place reduce), and without (reduced inside the next norm).
    "tiny-llama-bias-buffer": (_derived("tiny-llama", attention_bias=True, mlp_bias=True), True),
    "tiny-llama-fused-buffer": (PRESETS["tiny-llama"], True),
}
BUFFERED = {"tiny-llama-bias-buffer", "tiny-llama-fused-buffer"}
BUFFER_ROWS = 4
"""Decode steps (2 rows) go through the buffer, the prefill (15 rows) does not fit and goes around it."""
FUSED_MAX_ROWS = 32
"""Rows of the fused region: every step of run_steps reduces in the next norm."""


class BufferAllReduce(SymmetricAllReduce):
    """SymmetricAllReduce's contract over a plain buffer and gloo: the row-parallel layers' paths
    of writing into the shared buffer and reducing in place or in the next norm, on CPU (the
    symmetric-memory kernels themselves need CUDA and run in tests/gpu)."""

    def all_reduce_(self, out: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        dist.all_reduce(out)
        return out

    def _reduce_add_rms_norm(self, x, half, residual, weight, eps):
        import torch.distributed as dist

        from tritongen.ops import reference

        self.fused_calls += 1
        total = x.clone()
        dist.all_reduce(total)
        return reference.add_rms_norm(total, residual, weight, eps)


def build(name: str) -> tuple[torch.nn.Module, ModelArch]:
    """The case's model in float32 on CPU with dummy weights of seed 0 (the same on every rank)."""
    if name in PRESETS:
        return load_model(f"dummy:{name}", torch.float32, CPU, seed=0)
    arch = ModelArch.from_hf_config(CASES[name][0])
    net = build_empty_model(arch, torch.float32, CPU)
    init_dummy_weights(net, seed=0)
    return net.eval(), arch


@torch.no_grad()
def run_steps(net: torch.nn.Module, arch: ModelArch) -> torch.Tensor:
    """Logits of a two-sequence prefill and two decode steps over a paged cache, stacked by row."""
    kv = [torch.full(net.kv_cache_shape(NUM_BLOCKS, BLOCK_SIZE), float("nan"))
          for _ in range(arch.num_hidden_layers)]
    gen = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, arch.vocab_size, (n,), generator=gen).tolist() for n in (9, 6)]
    tables = [[7, 2, 11, 5], [3, 14, 0]]  # non-contiguous, 12 slots each
    done, out = [0, 0], []
    for q_lens in ([9, 6], [1, 1], [1, 1]):
        step_ids, pos = [], []
        for i, q in enumerate(q_lens):
            if done[i] + q > len(ids[i]):
                ids[i].append(int(torch.randint(0, arch.vocab_size, (1,), generator=gen)))
            step_ids += ids[i][done[i]:done[i] + q]
            pos += range(done[i], done[i] + q)
        seq_lens = [d + q for d, q in zip(done, q_lens)]
        meta = build_attention_metadata(q_lens, seq_lens, tables, BLOCK_SIZE)
        out.append(net.compute_logits(net(torch.tensor(step_ids), torch.tensor(pos), kv, meta)))
        done = seq_lens
    return torch.cat(out)


def rank_main(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    """One rank: shard every case, run it, save {name: (logits, kv cache shape)} to rank<r>.pt."""
    import torch.distributed as dist

    from tritongen.parallel.tensor_parallel import shard_model

    torch.set_num_threads(1)  # two ranks share the two cores
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
        results = {}
        for name, (_, fuse) in CASES.items():
            net, arch = build(name)
            shard_model(net, rank, world_size)
            if name in BUFFERED:
                fused = 0 if "bias" in name else arch.hidden_size
                buf = torch.full((BUFFER_ROWS * arch.hidden_size,), float("nan"))
                sym = BufferAllReduce(buf, "cpu-buffer", torch.full((2, FUSED_MAX_ROWS, fused), float("nan")) if fused else None)
                sym.fused_calls = 0
                net.model.layers[0].mlp.down_proj.shard.symmetric = sym
            if fuse:
                net.fuse_projections()
            results[name] = (run_steps(net, arch), net.kv_cache_shape(NUM_BLOCKS, BLOCK_SIZE))
            if name in BUFFERED and not fused:  # the decode steps' sums went through it
                assert not buf[:2 * arch.hidden_size].isnan().any(), "the row-parallel layers never wrote the buffer"
            if name in BUFFERED and fused:  # two per layer in each of the 3 steps (all within FUSED_MAX_ROWS)
                assert sym.fused_calls == 3 * 2 * arch.num_hidden_layers, sym.fused_calls
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # neither rank tears gloo down while the other may still be talking to it
        dist.destroy_process_group()
    except BaseException:
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise
