"""The modules of a tensor-parallel rank (parallel.tensor_parallel swaps them in) and its Shard.

Row-parallel layers sum their partial outputs over the ranks (inside the next RMSNorm where the
family's layout allows, parallel.symmetric); the vocabulary-parallel embedding and lm_head give
every rank whole embeddings and whole logits; an MoE block keeps its router whole and sums its
experts' partial outputs in one all-reduce.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tritongen.config import ParallelConfig
from tritongen.models.llama import RMSNorm
from tritongen.models.moe import SparseMoeBlock
from tritongen.ops import kernels
from tritongen.parallel.symmetric import SymmetricAllReduce
from tritongen.parallel.tp_plans import vocab_slice


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


class RowParallelLinear(nn.Linear):
    """`in_features` input features of a Linear shaped like `full`; partial outputs are summed
    across ranks, then the full (replicated) bias is added once.

    With the shard's symmetric buffer the GEMM writes into it (parallel.symmetric): with a `half`
    (the layer is followed by a ReducingRMSNorm) small batches come back as unreduced partial sums
    in that half of the buffer for the norm to reduce (the two row-parallel layers of a Llama layer
    alternate halves); other batches, and every batch without a `half`, are summed in place and
    come back as a view of the buffer, valid until the next row-parallel layer runs (every family
    consumes it in the residual add or the norm right after)."""

    def __init__(self, in_features: int, full: nn.Linear, shard: Shard, half: Optional[int] = None) -> None:
        w = full.weight
        super().__init__(in_features, full.out_features, bias=full.bias is not None,
                         device=w.device, dtype=w.dtype)
        self.shard, self.half = shard, half

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sym = self.shard.symmetric
        rows = x.numel() // x.shape[-1]
        if sym is not None and self.bias is None and self.half is not None:
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
        self.vocab_start, per_rank = vocab_slice(self.vocab_size, shard.rank, shard.world_size)
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
        _, per_rank = vocab_slice(self.vocab_size, shard.rank, shard.world_size)
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


class ParallelSparseMoeBlock(SparseMoeBlock):
    """An MoE block whose experts keep `inter` of their intermediate features each (w13: the
    matching gate rows and up rows, w2: the matching columns), so the fused experts kernel sees
    whole stacks [E, 2 * inter, H] / [E, H, inter]. The router (replicated) routes every token the
    same way on every rank; the ranks' weighted partial sums are all-reduced once."""

    def __init__(self, full: SparseMoeBlock, inter: int, shard: Shard) -> None:
        nn.Module.__init__(self)
        self.top_k, self.renormalize, self.gate, self.shard = full.top_k, full.renormalize, full.gate, shard
        w13 = full.experts.w13
        num_experts, _, hidden = w13.shape
        self.experts = nn.Module()
        self.experts.w13 = nn.Parameter(w13.new_empty(num_experts, 2 * inter, hidden))
        self.experts.w2 = nn.Parameter(w13.new_empty(num_experts, hidden, inter))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shard.all_reduce(super().forward(x))
