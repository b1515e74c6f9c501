"""Gemma 2 and Gemma 3 text (Gemma2ForCausalLM, Gemma3ForCausalLM) over a paged KV cache.

Llama's projections and parameter names, with Gemma's differences read from the arch:
- every RMSNorm scales by (1 + weight) in float32 (arch.norm_weight_offset), and each block has
  four: input, post-attention, pre- and post-feedforward (sandwich norms, arch.sandwich_norm). A
  sandwich norm, the residual add after it and the norm after that are one kernel
  (RMSNorm.forward_add_norm): post-attention + pre-feed-forward, and post-feed-forward + the next
  block's input norm (the model's final norm after the last block), so blocks hand each other the
  normed stream and the stream;
- GeGLU MLP (gelu_pytorch_tanh), embeddings times sqrt(hidden) rounded to the model dtype;
- attention scale query_pre_attn_scalar ** -0.5, Gemma 2's attention-logit and final-logit
  softcapping (tanh), tied lm_head;
- layer_types: sliding-window layers and global layers (Gemma 2 alternates, Gemma 3 has five
  local per global); Gemma 3's local layers rotate with their own base (rope_local_base_freq)
  and its q and k heads are normed (qk-norm) before rotary.
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from tritongen.models.arch import ModelArch
from tritongen.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, RMSNorm, RotaryEmbedding
from tritongen.ops.attention import AttentionMetadata


class GemmaDecoderLayer(nn.Module):
    def __init__(self, arch: ModelArch, layer_idx: int) -> None:
        super().__init__()
        self.is_sliding = arch.layer_types[layer_idx] == "sliding_attention"
        self.self_attn = LlamaAttention(arch, layer_idx)  # scale, softcap, window, qk-norm from arch
        self.mlp = LlamaMLP(arch)  # hidden_act gelu_pytorch_tanh: GeGLU
        h, eps, offset = arch.hidden_size, arch.norm_eps, arch.norm_weight_offset
        self.input_layernorm = RMSNorm(h, eps, offset)
        self.post_attention_layernorm = RMSNorm(h, eps, offset)
        self.pre_feedforward_layernorm = RMSNorm(h, eps, offset)
        self.post_feedforward_layernorm = RMSNorm(h, eps, offset)

    def forward(self, h: torch.Tensor, residual: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                kv_cache: torch.Tensor, attn: AttentionMetadata, next_norm: RMSNorm
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """h: the residual stream through this block's input norm. Returns the stream after the block
        through `next_norm` (the next block's input norm, or the model's final norm) and the stream;
        each sandwich norm, its residual add and the norm after it are one kernel."""
        out = self.self_attn(h, cos, sin, kv_cache, attn)
        h, residual = self.post_attention_layernorm.forward_add_norm(out, residual, self.pre_feedforward_layernorm)
        return self.post_feedforward_layernorm.forward_add_norm(self.mlp(h), residual, next_norm)


class GemmaModel(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.embedding_multiplier = arch.embedding_multiplier
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(GemmaDecoderLayer(arch, i) for i in range(arch.num_hidden_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.norm_eps, arch.norm_weight_offset)
        self.rotary_emb = RotaryEmbedding(arch)
        self.rotary_emb_local = (None if arch.rope_local_theta is None else
                                 RotaryEmbedding(replace(arch, rope_theta=arch.rope_local_theta, rope_scaling=None)))
        """Gemma 3's sliding-window layers' rotary (plain RoPE, their own base); None = one for all."""

    def reset_buffers(self) -> None:
        self.rotary_emb.reset_buffers()
        if self.rotary_emb_local is not None:
            self.rotary_emb_local.reset_buffers()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn: AttentionMetadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        # HF rounds sqrt(hidden) to the model dtype before the product (bf16: 3584 ** 0.5 -> 60.0).
        x = x * float(torch.tensor(self.embedding_multiplier, dtype=x.dtype))  # a host scalar: graph-safe
        full = self.rotary_emb(positions)
        local = full if self.rotary_emb_local is None else self.rotary_emb_local(positions)
        h = self.layers[0].input_layernorm(x)
        next_norms = [layer.input_layernorm for layer in self.layers[1:]] + [self.norm]
        for layer, kv_cache, next_norm in zip(self.layers, kv_caches, next_norms, strict=True):
            cos, sin = local if layer.is_sliding else full
            h, x = layer(h, x, cos, sin, kv_cache, attn, next_norm)
        return h


class GemmaForCausalLM(LlamaForCausalLM):
    """Gemma 2 and Gemma 3 text; implements models.interface.CausalLM. Fused projections,
    checkpoint names and the HF state dict are the Llama family's."""

    model_class = GemmaModel

    def reset_buffers(self) -> None:
        self.model.reset_buffers()

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        cap = self.arch.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
