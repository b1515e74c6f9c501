"""Megatron-style tensor parallelism for the Llama family.

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

Two halves, so a rank never holds the full weights: `shard_modules` swaps in modules of the rank's
shapes (on the meta device, before allocation), and `ShardSpec`s (`shard_specs`) say which slice of
each full HF-named checkpoint tensor a rank keeps; the loader slices as it reads. `shard_model` does
both to a model whose full weights are already loaded, and `model_split` hands both to the loader
(models.loader.ModelSplit), which builds a rank's part directly. Shard before fuse_projections(): fusing
stacks the per-rank slices, and the state dict of a sharded model holds each rank's slices under
the HF names.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tritongen.config import ParallelConfig
from tritongen.models.arch import LLAMA_FAMILY, ModelArch
from tritongen.models.llama import Linear, LlamaAttention, LlamaForCausalLM, LlamaMLP, RMSNorm
from tritongen.models.loader import ModelSplit
from tritongen.ops import kernels
from tritongen.parallel.symmetric import SymmetricAllReduce


def validate_tensor_parallel(arch: ModelArch, world_size: int) -> None:
    """ValueError if `arch` cannot be split over `world_size` ranks (whole heads per rank, a family
    whose modules the sharding below knows)."""
    heads, kv_heads = arch.num_attention_heads, arch.num_key_value_heads
    if world_size < 1:
        raise ValueError(f"tensor parallel world_size must be >= 1, got {world_size}")
    if world_size > 1 and arch.architecture not in LLAMA_FAMILY:
        raise ValueError(f"tensor parallelism supports the Llama family only for now "
                         f"({', '.join(LLAMA_FAMILY)}), not {arch.architecture}; use tensor_parallel_size 1")
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


class Shard:
    """Where this rank sits: rank, world_size and the process group of its collectives, and the
    engine's ParallelConfig (which all-reduce kernels it may use, how long it waits for peers)."""

    def __init__(self, rank: int, world_size: int, group: Optional[dist.ProcessGroup] = None,
                 config: ParallelConfig = ParallelConfig()) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside [0, {world_size})")
        self.rank, self.world_size, self.group, self.config = rank, world_size, group, config
        self.symmetric: Optional[SymmetricAllReduce] = None
        """Set on CUDA (ModelRunner): row-parallel layers then reduce decode-sized outputs through it."""

    @property
    def custom_all_reduce(self) -> bool:
        """False: NCCL for every all-reduce (ParallelConfig.disable_custom_all_reduce)."""
        return not self.config.disable_custom_all_reduce

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(x, group=self.group)
        return x


# -- which slice of each full tensor a rank keeps ---------------------------------------------------

@dataclass(frozen=True)
class ShardSpec:
    """Keep `size` entries of dimension `dim` from `start`; entries past the full extent are zeros
    (the vocabulary's last slice is padded so all ranks hold equal shapes)."""

    dim: int
    start: int
    size: int

    def take(self, full: Any) -> torch.Tensor:
        """This rank's slice of `full`: a tensor, or a lazy safetensors slice (reads only the slice)."""
        shape = list(full.shape) if isinstance(full, torch.Tensor) else list(full.get_shape())
        stop = min(self.start + self.size, shape[self.dim])
        index = [slice(None)] * len(shape)
        index[self.dim] = slice(self.start, stop)
        part = full[tuple(index)]
        if stop - self.start == self.size:
            return part
        shape[self.dim] = self.size
        out = part.new_zeros(shape)
        out.narrow(self.dim, 0, stop - self.start).copy_(part)
        return out


def _vocab_slice(vocab_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """(start, padded per-rank size) of this rank's vocabulary slice."""
    per_rank = -(-vocab_size // world_size)
    return rank * per_rank, per_rank


def shard_specs(arch: ModelArch, rank: int, world_size: int) -> Callable[[str], Optional[ShardSpec]]:
    """HF parameter name -> the ShardSpec of `rank`, or None for a tensor every rank keeps whole."""
    validate_tensor_parallel(arch, world_size)
    d = arch.head_dim
    heads, kv_heads = arch.num_attention_heads // world_size, kv_heads_per_rank(arch, world_size)
    # Rank r's query heads read KV heads r*K/W onwards, also when K < W (then one replicated head).
    kv_start = rank * arch.num_key_value_heads // world_size
    q = (rank * heads * d, heads * d)
    kv = (kv_start * d, kv_heads * d)
    inter = arch.intermediate_size // world_size
    mlp = (rank * inter, inter)
    vocab = _vocab_slice(arch.vocab_size, rank, world_size)
    table = {
        "self_attn.q_proj.weight": (0, q), "self_attn.q_proj.bias": (0, q),
        "self_attn.k_proj.weight": (0, kv), "self_attn.k_proj.bias": (0, kv),
        "self_attn.v_proj.weight": (0, kv), "self_attn.v_proj.bias": (0, kv),
        "self_attn.o_proj.weight": (1, q),
        "mlp.gate_proj.weight": (0, mlp), "mlp.gate_proj.bias": (0, mlp),
        "mlp.up_proj.weight": (0, mlp), "mlp.up_proj.bias": (0, mlp),
        "mlp.down_proj.weight": (1, mlp),
        "model.embed_tokens.weight": (0, vocab), "lm_head.weight": (0, vocab),
    }

    def spec(name: str) -> Optional[ShardSpec]:
        key = name if name.startswith(("model.embed", "lm_head")) else ".".join(name.split(".")[-3:])
        hit = table.get(key)
        return None if hit is None or world_size == 1 else ShardSpec(hit[0], *hit[1])

    return spec


# -- the rank's module structure ----------------------------------------------------------------------

def shard_modules(model: LlamaForCausalLM, shard: Shard) -> None:
    """Swap in modules of this rank's shapes (uninitialized, on the model's device and dtype; the
    meta device works). Names stay the HF ones, so `shard_specs` names every parameter's slice."""
    arch = model.arch
    validate_tensor_parallel(arch, shard.world_size)
    if any(layer.self_attn.qkv_proj is not None for layer in model.model.layers):
        raise ValueError("shard_model must run before fuse_projections() (it slices q/k/v separately)")
    if shard.world_size > 1:
        if not dist.is_initialized():
            raise ValueError("tensor parallelism needs torch.distributed initialized "
                             "(init_process_group, gloo on CPU) before shard_model")
        if dist.get_world_size(shard.group) != shard.world_size:
            raise ValueError(f"process group has {dist.get_world_size(shard.group)} ranks, "
                             f"world_size is {shard.world_size}")
    for layer in model.model.layers:
        _shard_attention(layer.self_attn, arch, shard)
        _shard_mlp(layer.mlp, shard)
        # Every add_forward follows a row-parallel layer (o_proj, or the previous layer's down_proj).
        layer.input_layernorm = ReducingRMSNorm(layer.input_layernorm, shard)
        layer.post_attention_layernorm = ReducingRMSNorm(layer.post_attention_layernorm, shard)
    model.model.norm = ReducingRMSNorm(model.model.norm, shard)
    embed = VocabParallelEmbedding(model.model.embed_tokens, shard)
    model.model.embed_tokens = embed
    model.lm_head = ParallelLMHead(model.lm_head, embed if arch.tie_word_embeddings else None, shard)


def model_split(arch: ModelArch, shard: Shard) -> ModelSplit:
    """What the loader needs to build this rank's part of `arch` directly (shapes and slices)."""
    return ModelSplit(restructure=lambda model: shard_modules(model, shard),
                      spec=shard_specs(arch, shard.rank, shard.world_size))


def shard_model(model: LlamaForCausalLM, rank: int, world_size: int,
                group: Optional[dist.ProcessGroup] = None) -> None:
    """Replace the projections, embedding and lm_head of a model with loaded full weights, in
    place, by this rank's shards.

    torch.distributed must be initialized (any backend; gloo on CPU) when world_size > 1, with
    `group` (default: the world) holding world_size ranks that each call this with their own rank.
    """
    shard = Shard(rank, world_size, group)
    full = {name: p.detach() for name, p in model.named_parameters()}
    shard_modules(model, shard)
    spec = shard_specs(model.arch, rank, world_size)
    with torch.no_grad():
        for name, p in model.named_parameters():
            s = spec(name)
            p.copy_(full[name] if s is None else s.take(full[name]))


def _empty_linear(in_features: int, out_features: int, like: nn.Linear, bias: bool) -> nn.Linear:
    w = like.weight
    return Linear(in_features, out_features, bias=bias, device=w.device, dtype=w.dtype)


def _shard_attention(attn: LlamaAttention, arch: ModelArch, shard: Shard) -> None:
    d, heads = attn.head_dim, arch.num_attention_heads // shard.world_size
    kv_heads = kv_heads_per_rank(arch, shard.world_size)
    bias = attn.q_proj.bias is not None
    attn.q_proj = _empty_linear(arch.hidden_size, heads * d, attn.q_proj, bias)
    attn.k_proj = _empty_linear(arch.hidden_size, kv_heads * d, attn.k_proj, bias)
    attn.v_proj = _empty_linear(arch.hidden_size, kv_heads * d, attn.v_proj, bias)
    attn.o_proj = RowParallelLinear(heads * d, attn.o_proj, shard, half=0)
    attn.num_heads, attn.num_kv_heads = heads, kv_heads
    attn.sizes = (heads * d, kv_heads * d, kv_heads * d)


def _shard_mlp(mlp: LlamaMLP, shard: Shard) -> None:
    n = mlp.gate_proj.out_features // shard.world_size
    h, bias = mlp.gate_proj.in_features, mlp.gate_proj.bias is not None
    mlp.gate_proj = _empty_linear(h, n, mlp.gate_proj, bias)
    mlp.up_proj = _empty_linear(h, n, mlp.up_proj, bias)
    mlp.down_proj = RowParallelLinear(n, mlp.down_proj, shard, half=1)


class RowParallelLinear(nn.Linear):
    """`in_features` input features of a Linear shaped like `full`; partial outputs are summed
    across ranks, then the full (replicated) bias is added once.

    With the shard's symmetric buffer the GEMM writes into it (parallel.symmetric): small batches
    come back as unreduced partial sums in buffer half `half` for the ReducingRMSNorm that follows
    (the two row-parallel layers of a Llama layer alternate halves); larger ones are summed in place
    and come back as a view of the buffer, valid until the next row-parallel layer runs (the Llama
    layers consume it in the residual add right away)."""

    def __init__(self, in_features: int, full: nn.Linear, shard: Shard, half: int = 0) -> None:
        w = full.weight
        super().__init__(in_features, full.out_features, bias=full.bias is not None,
                         device=w.device, dtype=w.dtype)
        self.shard, self.half = shard, half

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sym = self.shard.symmetric
        rows = x.numel() // x.shape[-1]
        if sym is not None and self.bias is None:
            part = sym.partial(self.half, rows, self.out_features)
            if part is not None:
                x2 = x.reshape(rows, x.shape[-1])
                kernels.linear(x2, self.weight, out=part)
                return part.view(*x.shape[:-1], self.out_features)
        out = sym.output(rows, self.out_features) if sym is not None else None
        if out is None:
            y = self.shard.all_reduce(kernels.linear(x, self.weight))
        else:
            kernels.linear(x.reshape(-1, x.shape[-1]), self.weight, out=out)
            y = sym.all_reduce_(out).view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


class ReducingRMSNorm(RMSNorm):
    """The RMSNorm after a row-parallel layer (same weight): when that layer left its partial sums
    unreduced in the symmetric buffer, add_forward sums them over the ranks, adds the residual and
    normalizes in one kernel; otherwise (its input is already summed) it is a plain RMSNorm."""

    def __init__(self, norm: RMSNorm, shard: Shard) -> None:
        nn.Module.__init__(self)
        self.weight, self.eps, self.offset, self.shard = norm.weight, norm.eps, norm.offset, shard

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sym = self.shard.symmetric
        if sym is not None and sym.is_pending(x):
            return sym.reduce_add_rms_norm(x, residual, self.weight, self.eps)
        return super().add_forward(x, residual)


class VocabParallelEmbedding(nn.Embedding):
    """This rank's slice of the vocabulary; ids outside it embed to zeros and an all_reduce sums the
    ranks' rows (exactly one rank contributes each id)."""

    def __init__(self, full: nn.Embedding, shard: Shard) -> None:
        self.vocab_size = full.num_embeddings
        self.vocab_start, per_rank = _vocab_slice(self.vocab_size, shard.rank, shard.world_size)
        w = full.weight
        super().__init__(per_rank, full.embedding_dim, device=w.device, dtype=w.dtype)
        self.shard = shard

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_embeddings)
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.shard.all_reduce(x.masked_fill(outside.unsqueeze(-1), 0))


class ParallelLMHead(nn.Linear):
    """This rank's vocab slice of lm_head (the embedding's own slice when tied); all_gather of the
    logits slices gives every rank the full [N, vocab]."""

    def __init__(self, full: nn.Linear, tied: Optional[VocabParallelEmbedding], shard: Shard) -> None:
        self.vocab_size = full.out_features
        _, per_rank = _vocab_slice(self.vocab_size, shard.rank, shard.world_size)
        w = full.weight
        super().__init__(full.in_features, per_rank, bias=False, device=w.device, dtype=w.dtype)
        self.shard = shard
        if tied is not None:
            self.weight = tied.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = kernels.linear(hidden, self.weight)
        if self.shard.world_size > 1:
            parts = [torch.empty_like(logits) for _ in range(self.shard.world_size)]
            dist.all_gather(parts, logits.contiguous(), group=self.shard.group)
            logits = torch.cat(parts, dim=-1)
        return logits[..., :self.vocab_size]
