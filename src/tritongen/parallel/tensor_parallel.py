"""Megatron-style tensor parallelism for the Llama family, applied in place to a built model.

Per decoder layer this costs two all_reduces of [T, hidden] (after o_proj and after down_proj):
- q/k/v and gate/up are column-parallel: each rank keeps whole heads / a slice of the intermediate
  features, so attention and SiLU·mul run locally without communication.
- o_proj and down_proj are row-parallel: each rank multiplies its input slice, the partial sums are
  all_reduced, and the bias (replicated) is added once after the reduce.
- embed_tokens is vocab-parallel (ids outside the rank's slice embed to zeros; all_reduce) and
  lm_head is vocab-parallel (each rank computes its logits slice; all_gather), so compute_logits
  returns the full [N, vocab] on every rank.

GQA with fewer KV heads than ranks replicates KV heads: each rank keeps the one KV head its query
heads read, so every rank has kv_heads_per_rank(arch, world_size) >= 1 heads in its KV cache.

For now shard_model slices full weights that already exist on every rank (built by load_model).
Loading each rank's shard directly from the checkpoint, without a full copy per rank, is a later
step of issue 7. Shard before fuse_projections(): fusing stacks the per-rank slices, and the state
dict of a sharded model holds each rank's slices under the HF names.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tritongen.models.arch import ModelArch
from tritongen.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP


def validate_tensor_parallel(arch: ModelArch, world_size: int) -> None:
    """ValueError if `arch` cannot be split over `world_size` ranks (whole heads per rank)."""
    heads, kv_heads = arch.num_attention_heads, arch.num_key_value_heads
    if world_size < 1:
        raise ValueError(f"tensor parallel world_size must be >= 1, got {world_size}")
    if world_size > heads:
        raise ValueError(f"tensor parallel world_size {world_size} is larger than num_attention_heads "
                         f"{heads}: every rank needs at least one whole query head")
    if heads % world_size:
        raise ValueError(f"num_attention_heads {heads} is not divisible by tensor parallel world_size "
                         f"{world_size}")
    if kv_heads >= world_size and kv_heads % world_size:
        raise ValueError(f"num_key_value_heads {kv_heads} is not divisible by tensor parallel world_size "
                         f"{world_size}")
    if kv_heads < world_size and world_size % kv_heads:
        raise ValueError(f"tensor parallel world_size {world_size} is not a multiple of num_key_value_heads "
                         f"{kv_heads}: KV heads can only be replicated a whole number of times")
    if arch.intermediate_size % world_size:
        raise ValueError(f"intermediate_size {arch.intermediate_size} is not divisible by tensor parallel "
                         f"world_size {world_size}")


def kv_heads_per_rank(arch: ModelArch, world_size: int) -> int:
    """KV heads in each rank's cache: a slice of them, or one replicated head when they are fewer
    than the ranks."""
    validate_tensor_parallel(arch, world_size)
    return max(1, arch.num_key_value_heads // world_size)


def shard_model(model: LlamaForCausalLM, rank: int, world_size: int,
                group: Optional[dist.ProcessGroup] = None) -> None:
    """Replace model's projections, embedding and lm_head in place with this rank's shards.

    torch.distributed must be initialized (any backend; gloo on CPU) when world_size > 1, with
    `group` (default: the world) holding world_size ranks that each call this with their own rank.
    """
    arch = model.arch
    validate_tensor_parallel(arch, world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside [0, {world_size})")
    if any(layer.self_attn.qkv_proj is not None for layer in model.model.layers):
        raise ValueError("shard_model must run before fuse_projections() (it slices q/k/v separately)")
    if world_size > 1:
        if not dist.is_initialized():
            raise ValueError("tensor parallelism needs torch.distributed initialized "
                             "(init_process_group, gloo on CPU) before shard_model")
        if dist.get_world_size(group) != world_size:
            raise ValueError(f"process group has {dist.get_world_size(group)} ranks, world_size is {world_size}")
    shard = _Shard(rank, world_size, group)
    for layer in model.model.layers:
        _shard_attention(layer.self_attn, arch, shard)
        _shard_mlp(layer.mlp, shard)
    embed = VocabParallelEmbedding(model.model.embed_tokens, shard)
    model.model.embed_tokens = embed
    model.lm_head = ParallelLMHead(model.lm_head, embed if arch.tie_word_embeddings else None, shard)


class _Shard:
    """Where this rank sits: rank, world_size and the process group of its collectives."""

    def __init__(self, rank: int, world_size: int, group: Optional[dist.ProcessGroup]) -> None:
        self.rank, self.world_size, self.group = rank, world_size, group

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(x, group=self.group)
        return x


def _shard_attention(attn: LlamaAttention, arch: ModelArch, shard: _Shard) -> None:
    d, heads = attn.head_dim, arch.num_attention_heads // shard.world_size
    kv_heads = kv_heads_per_rank(arch, shard.world_size)
    # Rank r's query heads read KV heads r*K/W onwards, also when K < W (then one replicated head).
    kv_start = shard.rank * arch.num_key_value_heads // shard.world_size
    q_rows = slice(shard.rank * heads * d, (shard.rank + 1) * heads * d)
    kv_rows = slice(kv_start * d, (kv_start + kv_heads) * d)
    attn.q_proj = column_parallel(attn.q_proj, q_rows)
    attn.k_proj = column_parallel(attn.k_proj, kv_rows)
    attn.v_proj = column_parallel(attn.v_proj, kv_rows)
    attn.o_proj = RowParallelLinear(attn.o_proj, q_rows, shard)
    attn.num_heads, attn.num_kv_heads = heads, kv_heads
    attn.sizes = (heads * d, kv_heads * d, kv_heads * d)


def _shard_mlp(mlp: LlamaMLP, shard: _Shard) -> None:
    n = mlp.gate_proj.out_features // shard.world_size
    rows = slice(shard.rank * n, (shard.rank + 1) * n)
    mlp.gate_proj = column_parallel(mlp.gate_proj, rows)
    mlp.up_proj = column_parallel(mlp.up_proj, rows)
    mlp.down_proj = RowParallelLinear(mlp.down_proj, rows, shard)


def column_parallel(full: nn.Linear, rows: slice) -> nn.Linear:
    """The output features `rows` of `full` (weight and bias): its output stays sharded, so a plain
    Linear needs no communication."""
    w = full.weight
    out = nn.Linear(full.in_features, rows.stop - rows.start, bias=full.bias is not None,
                    device=w.device, dtype=w.dtype)
    with torch.no_grad():
        out.weight.copy_(w[rows])
        if full.bias is not None:
            out.bias.copy_(full.bias[rows])
    return out


class RowParallelLinear(nn.Linear):
    """Input features `cols` of a Linear; partial outputs are summed across ranks, then the full
    (replicated) bias is added once."""

    def __init__(self, full: nn.Linear, cols: slice, shard: _Shard) -> None:
        w = full.weight
        super().__init__(cols.stop - cols.start, full.out_features, bias=full.bias is not None,
                         device=w.device, dtype=w.dtype)
        self.shard = shard
        with torch.no_grad():
            self.weight.copy_(w[:, cols])
            if full.bias is not None:
                self.bias.copy_(full.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.shard.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


def _vocab_slice(vocab_size: int, shard: _Shard) -> tuple[int, int]:
    """(start, padded per-rank size): all ranks hold equal slices so all_gather sees equal shapes;
    the last slice is padded with zero rows past the vocabulary."""
    per_rank = -(-vocab_size // shard.world_size)
    return shard.rank * per_rank, per_rank


def _padded_rows(full: torch.Tensor, start: int, n: int) -> torch.Tensor:
    out = full.new_zeros((n, full.shape[1]))
    rows = full[start:start + n]
    out[:rows.shape[0]] = rows
    return out


class VocabParallelEmbedding(nn.Embedding):
    """This rank's slice of the vocabulary; ids outside it embed to zeros and an all_reduce sums the
    ranks' rows (exactly one rank contributes each id)."""

    def __init__(self, full: nn.Embedding, shard: _Shard) -> None:
        self.vocab_size = full.num_embeddings
        self.vocab_start, per_rank = _vocab_slice(self.vocab_size, shard)
        w = full.weight
        super().__init__(per_rank, full.embedding_dim, device=w.device, dtype=w.dtype)
        self.shard = shard
        with torch.no_grad():
            self.weight.copy_(_padded_rows(w, self.vocab_start, per_rank))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_embeddings)
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.shard.all_reduce(x.masked_fill(outside.unsqueeze(-1), 0))


class ParallelLMHead(nn.Linear):
    """This rank's vocab slice of lm_head (the embedding's own slice when tied); all_gather of the
    logits slices gives every rank the full [N, vocab]."""

    def __init__(self, full: nn.Linear, tied: Optional[VocabParallelEmbedding], shard: _Shard) -> None:
        self.vocab_size = full.out_features
        start, per_rank = _vocab_slice(self.vocab_size, shard)
        w = full.weight
        super().__init__(full.in_features, per_rank, bias=False, device=w.device, dtype=w.dtype)
        self.shard = shard
        if tied is not None:
            self.weight = tied.weight
        else:
            with torch.no_grad():
                self.weight.copy_(_padded_rows(w, start, per_rank))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.weight)
        if self.shard.world_size > 1:
            parts = [torch.empty_like(logits) for _ in range(self.shard.world_size)]
            dist.all_gather(parts, logits.contiguous(), group=self.shard.group)
            logits = torch.cat(parts, dim=-1)
        return logits[..., :self.vocab_size]
