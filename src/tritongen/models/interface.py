"""The model interface: what the runner, the loader, the HF twin and tensor parallelism call.

A model class is an nn.Module built from a ModelArch (`cls(arch)`, on the meta device: the loader
allocates it afterwards) that implements CausalLM below, and is registered by HF class name in
models/registry.py. Everything that differs between families is a ModelArch field or lives inside
the model file, so adding a family is one model file, its arch parser and writer, and tests.

The step contract (every family):
- input is one flat batch of T tokens from many sequences (`input_ids`, `positions` [T] int64);
  `attn` (ops.attention.AttentionMetadata) says where each sequence's tokens and blocks are;
- each layer stores this step's K and V at `attn.slot_mapping` in its own `kv_caches[i]`, of the
  shape `kv_cache_shape()` gives, before attending (queries see their own keys through the cache);
- `forward` returns the final hidden states [T, hidden]; `compute_logits` maps only the rows the
  runner samples to float32 logits [N, vocab], so a long prefill never builds [T, vocab].
"""
from __future__ import annotations

from typing import Any, Iterator, Protocol, runtime_checkable

import torch

from tritongen.models.arch import ModelArch
from tritongen.ops.attention import AttentionMetadata


@runtime_checkable
class CausalLM(Protocol):
    arch: ModelArch

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn: AttentionMetadata) -> torch.Tensor:
        """Final hidden states [T, hidden] of the flat batch (see the step contract above)."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits [N, vocab] of the given rows of `hidden`."""

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """Shape of one layer's cache: (2, num_blocks, block_size, this rank's KV heads, head_dim)."""

    def tie_weights(self) -> None:
        """Share the input embedding with lm_head if the arch says so (again after to_empty)."""

    def reset_buffers(self) -> None:
        """Recompute non-persistent buffers (rotary frequencies...) after meta build and to_empty."""

    def fuse_projections(self) -> None:
        """Stack projections into fewer GEMMs (called on CUDA only); a no-op where nothing stacks.
        The state dict must keep HF names afterwards."""

    def checkpoint_tensors(self, name: str, tensor: Any) -> Iterator[tuple[str, Any]]:
        """Map one tensor of an HF checkpoint (a torch tensor or a lazy safetensors slice) to
        (parameter name, tensor) pairs of this model: none for tensors to skip, several for fused
        ones split at load, transposed ones for other layouts. Yield a lazy slice unchanged when
        no conversion is needed, so tensor parallelism reads only its rank's part."""

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """This model's weights under the HF class's names and layouts (for the HF twin)."""

    # nn.Module provides the rest that callers use: named_parameters, state_dict, eval, to.
    # Tensor parallelism is not part of the interface: parallel/tensor_parallel.py shards each
    # family's modules by its entry in parallel/tp_plans.py PLANS.
