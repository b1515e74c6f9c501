"""Megatron-style tensor parallelism for every family the engine serves (parallel.tp_plans).

Per decoder layer this costs two all_reduces of [T, hidden] (after the attention's output
projection and after the MLP, or after an MoE block's expert sum):
- q/k/v (or a fused per-head qkv) and the MLP's input projections are column-parallel: each rank
  keeps whole heads / a slice of the intermediate features, so attention (with the ALiBi slopes of
  the rank's own heads) and the activation run locally without communication;
- the output projections are row-parallel: each rank multiplies its input slice, the partial sums
  are all_reduced, and the bias (replicated) is added once after the reduce;
- an MoE block keeps every expert with a slice of its intermediate features and the router whole;
- the token embedding is vocab-parallel (ids outside the rank's slice embed to zeros; all_reduce)
  and so is lm_head (each rank computes its logits slice; all_gather), so compute_logits returns
  the full [N, vocab] on every rank, softcapped or not.

GQA with fewer KV heads than ranks replicates KV heads: each rank keeps the one KV head its query
heads read, so every rank has kv_heads_per_rank(arch, world_size) >= 1 heads in its KV cache.

Two halves, so a rank never holds the full weights: `shard_modules` swaps in modules of the rank's
shapes (on the meta device, before allocation), and `ShardSpec`s (`shard_specs`) say which slice of
each full tensor a rank keeps, by the model's parameter names (what checkpoint_tensors yields); the
loader slices as it reads. `shard_model` does both to a model whose full weights are already loaded,
and `model_split` hands both to the loader (models.loader.ModelSplit), which builds a rank's part
directly. Shard before fuse_projections(): fusing stacks the per-rank slices, and the state dict of a
sharded model holds each rank's slices under the unfused names.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch import nn

from tritongen.models.arch import ModelArch
from tritongen.models.llama import Linear
from tritongen.models.loader import ModelSplit
from tritongen.models.moe import SparseMoeBlock
from tritongen.parallel.tp_layers import (
    ParallelLMHead,
    ParallelSparseMoeBlock,
    ReducingRMSNorm,
    RowParallelLinear,
    Shard,
    VocabParallelEmbedding,
)
from tritongen.parallel.tp_plans import (
    EXPERT,
    PLANS,
    Q,
    VOCAB,
    TPPlan,
    feature_slices,
    kv_heads_per_rank,
    validate_tensor_parallel,
)

__all__ = ["Shard", "ShardSpec", "kv_heads_per_rank", "model_split", "shard_model", "shard_modules",
           "shard_specs", "validate_tensor_parallel"]


# -- which slice of each full tensor a rank keeps ---------------------------------------------------

@dataclass(frozen=True)
class ShardSpec:
    """Keep `size` entries of dimension `dim` from `start`; entries past the full extent are zeros
    (the vocabulary's last slice is padded so all ranks hold equal shapes)."""

    dim: int
    start: int
    size: int
    chunks: int = 1
    """The dimension stacks this many equal parts (an MoE expert's gate rows, then its up rows):
    the slice is taken from each part, and the rank's parts are stacked the same way."""

    def take(self, full: Any) -> torch.Tensor:
        """This rank's slice of `full`: a tensor, or a lazy safetensors slice (reads only the slice)."""
        shape = list(full.shape) if isinstance(full, torch.Tensor) else list(full.get_shape())
        part = shape[self.dim] // self.chunks
        pieces = [self._take(full, shape, c * part + self.start, (c + 1) * part) for c in range(self.chunks)]
        return pieces[0] if self.chunks == 1 else torch.cat(pieces, dim=self.dim)

    def _take(self, full: Any, shape: list[int], start: int, end: int) -> torch.Tensor:
        stop = min(start + self.size, end)
        index = [slice(None)] * len(shape)
        index[self.dim] = slice(start, stop)
        got = full[tuple(index)]
        if stop - start == self.size:
            return got
        padded = list(shape)
        padded[self.dim] = self.size
        out = got.new_zeros(padded)
        out.narrow(self.dim, 0, stop - start).copy_(got)
        return out


def _plan(arch: ModelArch, world_size: int) -> TPPlan:
    validate_tensor_parallel(arch, world_size)
    return PLANS[arch.architecture]


def _split_table(plan: TPPlan) -> dict[str, tuple[int, str, int]]:
    """Parameter name inside a layer (or in the model, for the vocabulary) -> (dim, kind, chunks)."""
    table = {}
    for path, kind in plan.column.items():
        table[f"{path}.weight"] = table[f"{path}.bias"] = (0, kind, 1)
    for path, kind in plan.row.items():
        table[f"{path}.weight"] = (1, kind, 1)
    if plan.experts is not None:
        table[f"{plan.experts}.experts.w13"] = (1, EXPERT, 2)
        table[f"{plan.experts}.experts.w2"] = (2, EXPERT, 1)
    table[f"{plan.embed}.weight"] = table["lm_head.weight"] = (0, VOCAB, 1)
    return table


def _local_name(plan: TPPlan) -> Callable[[str], str]:
    """Parameter name -> its name inside its layer (unchanged outside the layers)."""
    in_layer = re.compile(rf"^{re.escape(plan.layers)}\.\d+\.")
    return lambda name: in_layer.sub("", name, count=1)


def shard_specs(arch: ModelArch, rank: int, world_size: int) -> Callable[[str], Optional[ShardSpec]]:
    """Parameter name -> the ShardSpec of `rank`, or None for a tensor every rank keeps whole."""
    plan = _plan(arch, world_size)
    slices = feature_slices(arch, rank, world_size)
    table, local = _split_table(plan), _local_name(plan)

    def spec(name: str) -> Optional[ShardSpec]:
        hit = table.get(local(name))
        if hit is None or world_size == 1:
            return None
        dim, kind, chunks = hit
        return ShardSpec(dim, *slices[kind], chunks=chunks)

    return spec


# -- the rank's module structure ----------------------------------------------------------------------

def shard_modules(model: nn.Module, shard: Shard) -> None:
    """Swap in modules of this rank's shapes (uninitialized, on the model's device and dtype; the
    meta device works). Parameter names stay, so `shard_specs` names every parameter's slice."""
    arch = model.arch
    plan = _plan(arch, shard.world_size)
    _check_ready(model, plan, shard)
    slices = feature_slices(arch, shard.rank, shard.world_size)
    size = {kind: n for kind, (_, n) in slices.items()}
    halves = {path: i for i, path in enumerate(plan.row)} if plan.reducing_norms else {}
    seen: set[str] = set()
    for layer in _get(model, plan.layers):
        for path, kind in plan.column.items():
            full = _get(layer, path)
            if full is not None:
                _set(layer, path, Linear(full.in_features, size[kind], bias=full.bias is not None,
                                         device=full.weight.device, dtype=full.weight.dtype))
                seen.add(path)
        for path, kind in plan.row.items():
            full = _get(layer, path)
            if full is not None:
                _set(layer, path, RowParallelLinear(size[kind], full, shard, halves.get(path)))
                seen.add(path)
        block = _get(layer, plan.experts) if plan.experts is not None else None
        if isinstance(block, SparseMoeBlock):
            _set(layer, plan.experts, ParallelSparseMoeBlock(block, size[EXPERT], shard))
        _shard_heads(_get(layer, plan.attention), arch, shard.world_size)
        for path in plan.reducing_norms:  # each add_forward follows a row-parallel layer
            _set(layer, path, ReducingRMSNorm(_get(layer, path), shard))
    if plan.final_norm is not None:
        _set(model, plan.final_norm, ReducingRMSNorm(_get(model, plan.final_norm), shard))
    _keep_rank_alibi_slopes(model, slices)
    embed = VocabParallelEmbedding(_get(model, plan.embed), shard)
    _set(model, plan.embed, embed)
    model.lm_head = ParallelLMHead(model.lm_head, embed if arch.tie_word_embeddings else None, shard)
    # An MoE block replaces the dense MLP in every layer of Mixtral: its paths may go unused.
    optional = f"{plan.experts}." if plan.experts is not None else None
    missing = sorted(p for p in (set(plan.column) | set(plan.row)) - seen
                     if optional is None or not p.startswith(optional))
    if missing:
        raise ValueError(f"the tensor-parallel plan of {arch.architecture} names modules no layer has: {missing}")
    _check_covered(model, plan)


def _check_ready(model: nn.Module, plan: TPPlan, shard: Shard) -> None:
    for layer in _get(model, plan.layers):
        fused = [getattr(m, name, None) for m in layer.modules() for name in ("qkv_proj", "gate_up_proj")]
        if any(f is not None for f in fused):
            raise ValueError("shard_model must run before fuse_projections() (it slices q/k/v separately)")
    if shard.world_size > 1:
        if not dist.is_initialized():
            raise ValueError("tensor parallelism needs torch.distributed initialized "
                             "(init_process_group, gloo on CPU) before shard_model")
        if dist.get_world_size(shard.group) != shard.world_size:
            raise ValueError(f"process group has {dist.get_world_size(shard.group)} ranks, "
                             f"world_size is {shard.world_size}")


def _shard_heads(attn: nn.Module, arch: ModelArch, world_size: int) -> None:
    """The attention module attends with the rank's heads (num_kv_heads and sizes where it has them:
    multi-head families have neither)."""
    heads, kv_heads, d = arch.num_attention_heads // world_size, kv_heads_per_rank(arch, world_size), arch.head_dim
    attn.num_heads = heads
    if hasattr(attn, "num_kv_heads"):
        attn.num_kv_heads = kv_heads
    if hasattr(attn, "sizes"):
        attn.sizes = (heads * d, kv_heads * d, kv_heads * d)


def _keep_rank_alibi_slopes(model: nn.Module, slices: dict[str, tuple[int, int]]) -> None:
    """Modules with ALiBi slopes (`alibi_heads`: which of the model's heads they cover) keep the
    slopes of the rank's query heads: a head's slope depends on its index among all heads."""
    d = model.arch.head_dim
    start, size = slices[Q][0] // d, slices[Q][1] // d
    for m in model.modules():
        if getattr(m, "alibi_heads", None) is None:
            continue
        if m.alibi_heads != slice(0, model.arch.num_attention_heads):
            raise ValueError(f"{type(m).__name__} already keeps a subset of the heads: shard a model once")
        m.alibi_heads = slice(start, start + size)
        if m.alibi_slopes is not None:
            m.alibi_slopes = m.alibi_slopes[m.alibi_heads]


def _check_covered(model: nn.Module, plan: TPPlan) -> None:
    """Every matrix is split by the plan or declared replicated (a forgotten projection fails here,
    not as a shape error deep inside a forward)."""
    table, local = _split_table(plan), _local_name(plan)
    whole = [name for name, p in model.named_parameters()
             if p.dim() >= 2 and local(name) not in table and local(name).rpartition(".")[0] not in plan.replicated]
    if whole:
        raise ValueError(f"the tensor-parallel plan of {model.arch.architecture} neither splits nor replicates "
                         f"{whole[:5]}")


def _get(root: nn.Module, path: str) -> Any:
    for part in path.split("."):
        root = getattr(root, part, None)
        if root is None:
            return None
    return root


def _set(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, leaf = path.rpartition(".")
    setattr(_get(root, parent) if parent else root, leaf, module)


def model_split(arch: ModelArch, shard: Shard) -> ModelSplit:
    """What the loader needs to build this rank's part of `arch` directly (shapes and slices)."""
    return ModelSplit(restructure=lambda model: shard_modules(model, shard),
                      spec=shard_specs(arch, shard.rank, shard.world_size))


def shard_model(model: nn.Module, rank: int, world_size: int,
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
