"""GPT-2 (GPT2LMHeadModel) over a paged KV cache: learned absolute positions, pre-LayerNorm with
bias, plain GELU MLP, multi-head attention, lm_head tied to the token embedding.

Our parameters keep HF's names except where the layout differs: HF's Conv1D stores weights
[in, out] (we use Linear's [out, in], transposed at load) and its fused `attn.c_attn` is split at
load into q_proj / k_proj / v_proj, the layout the Llama code and its kernels already use.
`checkpoint_tensors` does both on load and `hf_state_dict` undoes them for the HF twin.
On CUDA each LayerNorm is one Triton kernel with the residual add before it fused in
(kernels.add_layer_norm, as Llama fuses it into its RMSNorm) and the GELU another (kernels.activation).
"""
from __future__ import annotations

from typing import Any, Iterator, Optional

import torch
from torch import nn

from tritongen.models.arch import ModelArch
from tritongen.models.llama import Linear
from tritongen.ops import kernels
from tritongen.ops.attention import AttentionMetadata, cached_attention

_CONV1D = ("attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
"""Conv1D weights of a block besides c_attn: [in, out] in HF checkpoints."""
_SKIPPED = (".attn.bias", ".attn.masked_bias")
"""Causal-mask buffers that old GPT-2 checkpoints saved; we mask in the attention op."""
_QKV = ("q_proj", "k_proj", "v_proj")


class LayerNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.layer_norm(x, self.weight, self.bias, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): the residual add fused into the norm."""
        return kernels.add_layer_norm(x, residual, self.weight, self.bias, self.eps)


class GPT2Attention(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        h = arch.hidden_size
        self.num_heads, self.head_dim = arch.num_attention_heads, arch.head_dim
        self.scale = self.head_dim ** -0.5
        self.q_proj, self.k_proj, self.v_proj = (Linear(h, h) for _ in range(3))
        self.c_proj = Linear(h, h)

    def forward(self, x: torch.Tensor, kv_cache: torch.Tensor, attn: AttentionMetadata) -> torch.Tensor:
        T = x.shape[0]
        q, k, v = (p(x).view(T, self.num_heads, self.head_dim) for p in (self.q_proj, self.k_proj, self.v_proj))
        out = cached_attention(q, k, v, kv_cache, attn, self.scale)
        return self.c_proj(out.reshape(T, self.num_heads * self.head_dim))


class GPT2MLP(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.c_fc = Linear(arch.hidden_size, arch.intermediate_size)
        self.c_proj = Linear(arch.intermediate_size, arch.hidden_size)
        self.act = arch.hidden_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(kernels.activation(self.c_fc(x), self.act))


class GPT2Block(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(arch.hidden_size, arch.norm_eps)
        self.attn = GPT2Attention(arch)
        self.ln_2 = LayerNorm(arch.hidden_size, arch.norm_eps)
        self.mlp = GPT2MLP(arch)

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor], kv_cache: torch.Tensor,
                attn: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous sublayer's output, still to be added to `residual` (None for the first
        block, whose x is the embedding). Returns this block's MLP output and the residual stream:
        each add happens inside the next norm (the same sums as x + f(ln(x)), fewer launches)."""
        if residual is None:
            residual, h = x, self.ln_1(x)
        else:
            h, residual = self.ln_1.add_forward(x, residual)
        h, residual = self.ln_2.add_forward(self.attn(h, kv_cache, attn), residual)
        return self.mlp(h), residual


class GPT2Model(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.wte = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.wpe = nn.Embedding(arch.max_position_embeddings, arch.hidden_size)
        self.h = nn.ModuleList(GPT2Block(arch) for _ in range(arch.num_hidden_layers))
        self.ln_f = LayerNorm(arch.hidden_size, arch.norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn: AttentionMetadata) -> torch.Tensor:
        x, residual = self.wte(input_ids) + self.wpe(positions), None
        for block, kv_cache in zip(self.h, kv_caches, strict=True):
            x, residual = block(x, residual, kv_cache, attn)
        return self.ln_f.add_forward(x, residual)[0] if residual is not None else self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    """GPT-2; implements models.interface.CausalLM."""

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.arch = arch
        self.transformer = GPT2Model(arch)
        self.lm_head = Linear(arch.hidden_size, arch.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.arch.tie_word_embeddings:
            self.lm_head.weight = self.transformer.wte.weight

    def reset_buffers(self) -> None:
        pass  # no non-persistent buffers: positions are a learned table

    def fuse_projections(self) -> None:
        pass  # q/k/v stay separate GEMMs (not measured on GPU yet)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn: AttentionMetadata) -> torch.Tensor:
        return self.transformer(input_ids, positions, kv_caches, attn)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        # The attention modules' head count, not arch's: tensor parallelism shards it per rank.
        return (2, num_blocks, block_size, self.transformer.h[0].attn.num_heads, self.arch.head_dim)

    def checkpoint_tensors(self, name: str, tensor: Any) -> Iterator[tuple[str, Any]]:
        if name.endswith(_SKIPPED):
            return
        if not name.startswith(("transformer.", "lm_head.")):
            name = "transformer." + name  # checkpoints saved from GPT2Model (the Hub's gpt2) lack it
        if name.endswith(("attn.c_attn.weight", "attn.c_attn.bias")):
            base, _, kind = name.rsplit(".", 2)  # "transformer.h.{i}.attn", "c_attn", "weight" | "bias"
            full = _materialize(tensor)
            # c_attn's output columns are [q | k | v], each hidden wide (heads in order inside).
            parts = full.t().chunk(3, dim=0) if kind == "weight" else full.chunk(3)
            for proj, part in zip(_QKV, parts):
                yield f"{base}.{proj}.{kind}", part
        elif name.endswith(_CONV1D):
            yield name, _materialize(tensor).t()
        else:
            yield name, tensor

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        ours = self.state_dict()
        out: dict[str, torch.Tensor] = {}
        for name, t in ours.items():
            if name.endswith(tuple(f"attn.{p}.weight" for p in _QKV) + tuple(f"attn.{p}.bias" for p in _QKV)):
                continue  # gathered into c_attn below
            out[name] = t.t() if name.endswith(_CONV1D) else t
        for i in range(self.arch.num_hidden_layers):
            base = f"transformer.h.{i}.attn."
            out[base + "c_attn.weight"] = torch.cat([ours[f"{base}{p}.weight"] for p in _QKV]).t()
            out[base + "c_attn.bias"] = torch.cat([ours[f"{base}{p}.bias"] for p in _QKV])
        return out


def _materialize(tensor: Any) -> torch.Tensor:
    return tensor if isinstance(tensor, torch.Tensor) else tensor[:]  # a lazy safetensors slice
