"""Phi-3 (Phi3ForCausalLM): the Llama layout with fused checkpoint projections and LongRoPE.

The checkpoint's qkv_proj ([q | k | v] rows) and gate_up_proj ([gate | up] rows) are split into
Llama's q/k/v and gate/up at load, so the Llama code runs the model and fuse_projections stacks
them again on the GPU; hf_state_dict fuses them back into Phi-3's names.

LongRoPE (rope type "longrope", "su" in older configs): inverse frequencies divided per dimension
by short_factor or long_factor, cos/sin times attention_factor. HF picks long for a whole forward
when max(position) + 1 > original_max_position_embeddings (and re-encodes the cached prompt once
when generation crosses it). Here the choice is per sequence and step: long when that sequence's
context after the step exceeds original_max_position_embeddings. That is HF's choice whenever the
prompt is prefilled in one chunk and generation does not cross the boundary; keys cached before
a crossing keep their short-factor rotation (HF re-encodes them).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterator

import torch
from torch import nn

from tritongen.models.arch import ModelArch
from tritongen.models.llama import LlamaForCausalLM, LlamaModel
from tritongen.ops import reference
from tritongen.ops.attention import AttentionMetadata

_QKV, _GATE_UP = "self_attn.qkv_proj", "mlp.gate_up_proj"


class LongRoPE(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        s = arch.rope_scaling
        self._args = (arch.head_dim, arch.rope_theta, s["short_factor"], s["long_factor"])
        self.original_max = int(s["original_max_position_embeddings"])
        self.attention_factor = float(s["attention_factor"])
        short, long = _longrope_inv_freqs(*self._args)
        self.register_buffer("short_inv_freq", short, persistent=False)
        self.register_buffer("long_inv_freq", long, persistent=False)

    def reset_buffers(self) -> None:
        device = self.short_inv_freq.device
        device = torch.device("cpu") if device.type == "meta" else device
        short, long = _longrope_inv_freqs(*self._args)
        self.short_inv_freq, self.long_inv_freq = short.to(device), long.to(device)

    def long_tokens(self, positions: torch.Tensor, attn: AttentionMetadata) -> torch.Tensor:
        """[T] bool: which tokens rotate with long_factor (their sequence's context after this
        step exceeds original_max_position_embeddings)."""
        if attn.max_query_len == 1:  # each token is its sequence's last: context = position + 1
            return positions >= self.original_max
        # From the device metadata only (a mixed step's CUDA graph replays other batches): each
        # row's sequence is the last with query_start_loc <= row (empty slots are skipped; rows
        # past the last sequence, padding, take the last slot, and nothing reads them).
        rows = torch.arange(positions.shape[0], dtype=attn.query_start_loc.dtype, device=positions.device)
        seq = torch.searchsorted(attn.query_start_loc, rows, right=True) - 1
        return attn.seq_lens[seq.clamp(0, attn.seq_lens.shape[0] - 1)] > self.original_max

    def forward(self, positions: torch.Tensor, attn: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        cos_s, sin_s = reference.rope_cos_sin(positions, self.short_inv_freq)
        cos_l, sin_l = reference.rope_cos_sin(positions, self.long_inv_freq)
        long = self.long_tokens(positions, attn)[:, None]
        return (torch.where(long, cos_l, cos_s) * self.attention_factor,
                torch.where(long, sin_l, sin_s) * self.attention_factor)


def _longrope_inv_freqs(head_dim: int, theta: float, short: list[float], long: list[float]
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(short, long) inverse frequencies [head_dim // 2] in float32 on CPU, as HF computes them."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    base = theta ** exponents
    return (1.0 / (torch.tensor(short, dtype=torch.float32) * base),
            1.0 / (torch.tensor(long, dtype=torch.float32) * base))


class Phi3Model(LlamaModel):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__(replace(arch, rope_scaling=None))  # its plain rotary, replaced below
        self.longrope = arch.rope_scaling is not None
        if self.longrope:
            self.rotary_emb = LongRoPE(arch)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn: AttentionMetadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(positions, attn) if self.longrope else self.rotary_emb(positions)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, cos, sin, kv_cache, attn)
        return self.norm.add_forward(x, residual)[0] if residual is not None else self.norm(x)


class Phi3ForCausalLM(LlamaForCausalLM):
    """Phi-3; implements models.interface.CausalLM."""

    model_class = Phi3Model

    def checkpoint_tensors(self, name: str, tensor: Any) -> Iterator[tuple[str, Any]]:
        base, _, kind = name.rpartition(".")
        if base.endswith(_QKV):
            # The checkpoint's sizes (arch's): a tensor-parallel rank's attention has fewer heads.
            a = self.arch
            sizes = [a.num_attention_heads * a.head_dim] + [a.num_key_value_heads * a.head_dim] * 2
            parts = zip(("q_proj", "k_proj", "v_proj"), _full(tensor).split(sizes))
            prefix = base[: -len("qkv_proj")]
        elif base.endswith(_GATE_UP):
            parts = zip(("gate_proj", "up_proj"), _full(tensor).chunk(2))
            prefix = base[: -len("gate_up_proj")]
        else:
            yield name, tensor
            return
        for part, t in parts:
            yield f"{prefix}{part}.{kind}", t

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Phi-3's names: q/k/v stacked into qkv_proj, gate/up into gate_up_proj (no biases)."""
        state = self.state_dict()  # Llama names, also after fuse_projections (its hook splits)
        for i in range(self.arch.num_hidden_layers):
            for fused, parts in ((_QKV, ("q_proj", "k_proj", "v_proj")), (_GATE_UP, ("gate_proj", "up_proj"))):
                group = f"model.layers.{i}.{fused.split('.')[0]}"
                state[f"model.layers.{i}.{fused}.weight"] = torch.cat(
                    [state.pop(f"{group}.{p}.weight") for p in parts])
        return state


def _full(tensor: Any) -> torch.Tensor:
    return tensor if isinstance(tensor, torch.Tensor) else tensor[:]
