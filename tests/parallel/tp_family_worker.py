"""Helpers of test_tp_families: each family's checkpoint in its own HF layout, a batched greedy
generation over a paged cache, and the rank process that runs it at tensor_parallel_size 2.

A module of its own (not the test file) because spawned processes import the worker by module
name, and pytest's importlib mode gives test files names that a fresh process cannot import.
"""
from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

import torch

from tritongen.models.loader import hf_config_dict, load_model
from tritongen.ops.attention import build_attention_metadata

FAMILIES = {
    "tiny-qwen3": "Qwen3 (qk-norm weights kept whole, head_dim 32 != hidden / heads)",
    "tiny-gpt2": "GPT-2 (Conv1D layout, fused c_attn, learned positions, tied head, odd vocab)",
    "tiny-bloom": "Bloom (ALiBi over 6 heads: the second slope sequence, per-head fused qkv)",
    "tiny-baichuan": "Baichuan2-7B (W_pack, RoPE, NormHead)",
    "tiny-baichuan-13b": "Baichuan2-13B (W_pack, ALiBi over 6 heads)",
    "tiny-gemma2": "Gemma 2 (sandwich norms, GeGLU, both softcaps, sliding layers of 8 keys)",
    "tiny-gemma3": "Gemma 3 (qk-norm, local and global rotary, tied head)",
    "tiny-phi3": "Phi-3 (fused qkv_proj / gate_up_proj, GQA, LongRoPE past 64 tokens)",
    "tiny-mixtral": "Mixtral (4 experts, top-2, every layer MoE)",
    "tiny-qwen3-moe": "Qwen3-MoE (8 experts, top-3, a dense layer between MoE layers)",
}
"""Tiny preset -> what of its family the split must get right."""
PROMPT_LENGTHS = (1, 6, 19, 70)
"""A single token, within and across blocks, past Gemma's 8-key window and Phi-3's 64-token LongRoPE boundary."""
NEW_TOKENS = 8
BLOCK_SIZE = 4
CPU = torch.device("cpu")


def write_checkpoint(preset: str, path: Path) -> None:
    """`dummy:<preset>`'s weights (seed 0) as an HF directory in the family's checkpoint layout
    (GPT-2's Conv1D c_attn, Phi-3's fused projections, Baichuan's W_pack, the experts' fused
    stacks), so that loading goes through the model's checkpoint_tensors before a rank slices."""
    from safetensors.torch import save_file

    net, arch = load_model(f"dummy:{preset}", torch.float32, CPU, seed=0)
    state = net.hf_state_dict()
    if arch.architecture == "BaichuanForCausalLM":
        for i in range(arch.num_hidden_layers):
            base = f"model.layers.{i}.self_attn."
            state[base + "W_pack.weight"] = torch.cat([state.pop(f"{base}{p}_proj.weight") for p in "qkv"])
    path.mkdir(parents=True)
    save_file({k: v.contiguous().clone() for k, v in state.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(hf_config_dict(f"dummy:{preset}")))


def prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


@torch.no_grad()
def greedy(net: torch.nn.Module) -> tuple[list[list[int]], torch.Tensor]:
    """(NEW_TOKENS greedy ids per prompt, their logprobs [prompts, NEW_TOKENS]): every prompt
    prefilled in one batched step, then batched decode steps, over one paged cache."""
    arch = net.arch
    seqs = prompts(arch.vocab_size)
    per_seq = -(-(max(PROMPT_LENGTHS) + NEW_TOKENS) // BLOCK_SIZE)
    num_blocks = per_seq * len(seqs)
    kv = [torch.full(net.kv_cache_shape(num_blocks, BLOCK_SIZE), float("nan")) for _ in range(arch.num_hidden_layers)]
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(2)).tolist()  # scattered blocks
    tables = [order[i * per_seq:(i + 1) * per_seq] for i in range(len(seqs))]
    done, new_ids, logprobs = [0] * len(seqs), [[] for _ in seqs], [[] for _ in seqs]
    for _ in range(NEW_TOKENS):
        q_lens = [len(s) - d for s, d in zip(seqs, done)]
        ids = [t for s, d in zip(seqs, done) for t in s[d:]]
        pos = [p for s, d in zip(seqs, done) for p in range(d, len(s))]
        seq_lens = [len(s) for s in seqs]
        meta = build_attention_metadata(q_lens, seq_lens, tables, BLOCK_SIZE)
        hidden = net(torch.tensor(ids), torch.tensor(pos), kv, meta)
        last = torch.tensor(q_lens).cumsum(0) - 1  # each sequence's last row
        lp = torch.log_softmax(net.compute_logits(hidden[last]), dim=-1)
        for i, row in enumerate(lp):
            token = int(row.argmax())
            new_ids[i].append(token)
            logprobs[i].append(float(row[token]))
            seqs[i] = seqs[i] + [token]
        done = seq_lens
    return new_ids, torch.tensor(logprobs)


def rank_main(rank: int, world_size: int, init_file: str, checkpoints: str, out_dir: str) -> None:
    """One rank: load its part of every family's checkpoint, generate, save {preset: (ids, logprobs,
    kv cache shape)} to rank<r>.pt."""
    import torch.distributed as dist

    from tritongen.models.loader import read_arch
    from tritongen.parallel.tensor_parallel import Shard, model_split

    torch.set_num_threads(1)  # two ranks share the two cores
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
        shard = Shard(rank, world_size)
        results = {}
        for preset in FAMILIES:
            path = os.path.join(checkpoints, preset)
            split = model_split(read_arch(path), shard)
            net, _ = load_model(path, torch.float32, CPU, split=split)
            results[preset] = (*greedy(net), net.kv_cache_shape(1, BLOCK_SIZE))
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # neither rank tears gloo down while the other may still be talking to it
        dist.destroy_process_group()
    except BaseException:
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise
