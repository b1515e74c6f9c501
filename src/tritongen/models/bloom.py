"""Bloom (BloomForCausalLM) over a paged KV cache: ALiBi position bias (no position embedding),
a LayerNorm on the word embeddings, pre-LayerNorm blocks with bias, Bloom's tanh GELU, multi-head
attention, lm_head tied to the embedding.

Parameter names and layouts are HF's. `query_key_value` stays fused as in the checkpoint: its
rows are per head [q_h | k_h | v_h] (interleaved), so a view splits it with no copy, and a
tensor-parallel rank's heads would be one contiguous slice of it.
The LayerNorms are gpt2.LayerNorm's: on CUDA one Triton kernel each, the residual add before a
block's norms fused in (kernels.add_layer_norm).
"""
from __future__ import annotations

from typing import Any, Iterator, Optional

import torch
from torch import nn

from tritongen.models.arch import ModelArch
from tritongen.models.gpt2 import LayerNorm
from tritongen.models.llama import Linear
from tritongen.ops import kernels, reference
from tritongen.ops.attention import AttentionMetadata, cached_attention


class BloomAttention(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        h = arch.hidden_size
        self.num_heads, self.head_dim = arch.num_attention_heads, arch.head_dim
        self.scale = self.head_dim ** -0.5
        self.query_key_value = Linear(h, 3 * h)
        self.dense = Linear(h, h)

    def forward(self, x: torch.Tensor, slopes: torch.Tensor, kv_cache: torch.Tensor,
                attn: AttentionMetadata) -> torch.Tensor:
        T = x.shape[0]
        q, k, v = self.query_key_value(x).view(T, self.num_heads, 3, self.head_dim).unbind(2)
        out = cached_attention(q, k, v, kv_cache, attn, self.scale, alibi_slopes=slopes)
        return self.dense(out.reshape(T, self.num_heads * self.head_dim))


class BloomMLP(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.dense_h_to_4h = Linear(arch.hidden_size, arch.intermediate_size)
        self.dense_4h_to_h = Linear(arch.intermediate_size, arch.hidden_size)
        self.act = arch.hidden_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(kernels.activation(self.dense_h_to_4h(x), self.act))


class BloomBlock(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.input_layernorm = LayerNorm(arch.hidden_size, arch.norm_eps)
        self.self_attention = BloomAttention(arch)
        self.post_attention_layernorm = LayerNorm(arch.hidden_size, arch.norm_eps)
        self.mlp = BloomMLP(arch)

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor], slopes: torch.Tensor,
                kv_cache: torch.Tensor, attn: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous sublayer's output, still to be added to `residual` (None for the first
        block, whose x is the normalized embedding); returns this block's MLP output and the
        residual stream, as GPT2Block does."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm.add_forward(x, residual)
        h, residual = self.post_attention_layernorm.add_forward(
            self.self_attention(h, slopes, kv_cache, attn), residual)
        return self.mlp(h), residual


class BloomModel(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.num_heads = arch.num_attention_heads
        self.alibi_heads = slice(0, self.num_heads)
        """The model's heads whose ALiBi slopes `alibi_slopes` holds (tensor parallelism: a rank's)."""
        self.word_embeddings = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.word_embeddings_layernorm = LayerNorm(arch.hidden_size, arch.norm_eps)
        self.h = nn.ModuleList(BloomBlock(arch) for _ in range(arch.num_hidden_layers))
        self.ln_f = LayerNorm(arch.hidden_size, arch.norm_eps)
        self.register_buffer("alibi_slopes", reference.alibi_slopes(self.num_heads)[self.alibi_heads],
                             persistent=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn: AttentionMetadata) -> torch.Tensor:
        # positions are unused: ALiBi takes each key's position from its place in the cache.
        x, residual = self.word_embeddings_layernorm(self.word_embeddings(input_ids)), None
        for block, kv_cache in zip(self.h, kv_caches, strict=True):
            x, residual = block(x, residual, self.alibi_slopes, kv_cache, attn)
        return self.ln_f.add_forward(x, residual)[0] if residual is not None else self.ln_f(x)


class BloomForCausalLM(nn.Module):
    """Bloom; implements models.interface.CausalLM."""

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.arch = arch
        self.transformer = BloomModel(arch)
        self.lm_head = Linear(arch.hidden_size, arch.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.arch.tie_word_embeddings:
            self.lm_head.weight = self.transformer.word_embeddings.weight

    def reset_buffers(self) -> None:
        # The slopes must stay float32 whatever the model dtype (like HF, which builds them so).
        device = self.transformer.alibi_slopes.device
        device = torch.device("cpu") if device.type == "meta" else device
        slopes = reference.alibi_slopes(self.arch.num_attention_heads)[self.transformer.alibi_heads]
        self.transformer.alibi_slopes = slopes.to(device)

    def fuse_projections(self) -> None:
        pass  # query_key_value is already one GEMM; the MLP has no gate

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn: AttentionMetadata) -> torch.Tensor:
        return self.transformer(input_ids, positions, kv_caches, attn)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        # The attention modules' head count, not arch's: tensor parallelism shards it per rank.
        return (2, num_blocks, block_size, self.transformer.h[0].self_attention.num_heads, self.arch.head_dim)

    def checkpoint_tensors(self, name: str, tensor: Any) -> Iterator[tuple[str, Any]]:
        if not name.startswith(("transformer.", "lm_head.")):
            name = "transformer." + name  # the Hub's Bloom checkpoints were saved from BloomModel
        yield name, tensor

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        return self.state_dict()
