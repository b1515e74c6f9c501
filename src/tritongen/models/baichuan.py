"""Baichuan and Baichuan2 (BaichuanForCausalLM), loaded from their own checkpoints' tensor names;
their remote code is never run (transformers has no class for them).

Both sizes are the Llama layout (RMSNorm, gated SiLU MLP, multi-head attention, no biases) with
q, k and v fused in the checkpoint as `self_attn.W_pack` ([q | k | v] rows), split at load into
Llama's q_proj / k_proj / v_proj (fuse_projections stacks them again on the GPU):
- the 7B rotates q and k (RoPE, base 10000), exactly as Llama;
- the 13B has no rotary: ALiBi, with the slopes of Bloom and of Baichuan's own _get_interleave
  (the same geometric series), a bias on key positions inside the paged attention.
Baichuan2's lm_head is a NormHead: its rows are L2-normalized before the product. The product of
normalized rows is all it ever computes at inference, so the rows are normalized once at load
(in float32; arch.normalized_lm_head) and the head is a plain linear layer afterwards. Dummy
weights skip the checkpoint path, so a dummy Baichuan2's head rows are not unit (same cost).
"""
from __future__ import annotations

from typing import Any, Iterator, Optional

import torch
import torch.nn.functional as F

from tritongen.models.arch import ModelArch
from tritongen.models.llama import LlamaAttention, LlamaForCausalLM, LlamaModel
from tritongen.ops import reference
from tritongen.ops.attention import AttentionMetadata, cached_attention

_W_PACK = ".self_attn.W_pack."


class BaichuanAttention(LlamaAttention):
    """Llama's attention; ALiBi layers (the 13B) add their bias instead of rotating."""

    def __init__(self, arch: ModelArch, layer_idx: int) -> None:
        super().__init__(arch, layer_idx)
        alibi = arch.position_encoding == "alibi"
        self.alibi_heads = slice(0, self.num_heads) if alibi else None
        """The model's heads whose ALiBi slopes `alibi_slopes` holds (tensor parallelism: a rank's)."""
        self._model_heads = arch.num_attention_heads
        self.register_buffer("alibi_slopes", self._slopes() if alibi else None, persistent=False)

    def _slopes(self) -> torch.Tensor:
        # A head's slope depends on its index among all the model's heads.
        return reference.alibi_slopes(self._model_heads)[self.alibi_heads]

    def reset_buffers(self) -> None:
        # float32 whatever the model dtype; computed on the CPU, then moved.
        if self.alibi_slopes is not None:
            device = self.alibi_slopes.device
            device = torch.device("cpu") if device.type == "meta" else device
            self.alibi_slopes = self._slopes().to(device)

    def forward(self, x: torch.Tensor, cos: Optional[torch.Tensor], sin: Optional[torch.Tensor],
                kv_cache: torch.Tensor, attn: AttentionMetadata) -> torch.Tensor:
        if self.alibi_slopes is None:
            return super().forward(x, cos, sin, kv_cache, attn)
        T = x.shape[0]
        q, k, v = self._qkv(x)
        out = cached_attention(q.view(T, self.num_heads, self.head_dim), k.view(T, self.num_kv_heads, self.head_dim),
                               v.view(T, self.num_kv_heads, self.head_dim), kv_cache, attn, self.scale,
                               alibi_slopes=self.alibi_slopes)
        return self.o_proj(out.reshape(T, self.num_heads * self.head_dim))


class BaichuanModel(LlamaModel):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__(arch)  # no rotary_emb for ALiBi (arch.position_encoding)
        for i, layer in enumerate(self.layers):
            layer.self_attn = BaichuanAttention(arch, i)


class BaichuanForCausalLM(LlamaForCausalLM):
    """Baichuan / Baichuan2, 7B (RoPE) and 13B (ALiBi); implements models.interface.CausalLM.
    hf_state_dict is Llama's (q/k/v apart, the head as normalized at load): the 7B's HF twin is
    LlamaForCausalLM (models.hf_twin.twin_arch)."""

    model_class = BaichuanModel

    def reset_buffers(self) -> None:
        super().reset_buffers()
        for layer in self.model.layers:
            layer.self_attn.reset_buffers()

    def checkpoint_tensors(self, name: str, tensor: Any) -> Iterator[tuple[str, Any]]:
        if _W_PACK in name:
            prefix, kind = name.split(_W_PACK)
            full = tensor if isinstance(tensor, torch.Tensor) else tensor[:]
            for part, t in zip(("q_proj", "k_proj", "v_proj"), full.chunk(3)):
                yield f"{prefix}.self_attn.{part}.{kind}", t
        elif name == "lm_head.weight" and self.arch.normalized_lm_head:
            full = tensor if isinstance(tensor, torch.Tensor) else tensor[:]
            yield name, F.normalize(full.float(), dim=-1)  # NormHead: unit rows
        else:
            yield name, tensor
