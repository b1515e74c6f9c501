"""Mixture-of-Experts decoders of the Llama layout: Mixtral and Qwen3-MoE.

Attention, norms and rotary are the Llama family's (models/llama.py; Qwen3-MoE's qk-norm is the
arch's qk_norm); the MLP of every MoE layer (arch.is_moe_layer) is a SparseMoeBlock: a router
(`gate`, no bias) picks each token's top-k experts, ops.moe runs their gated SiLU MLPs (the fused
Triton grouped GEMM on CUDA, the reference loop elsewhere). Qwen3-MoE's mlp_only_layers and
decoder_sparse_step keep some layers dense (LlamaMLP of intermediate_size).

Checkpoints come in two layouts, both loaded:
- the Hub's per-expert tensors (what transformers 5.x save_pretrained writes too):
  Mixtral model.layers.N.block_sparse_moe.{gate, experts.E.w1|w2|w3}; Qwen3-MoE
  model.layers.N.mlp.{gate, experts.E.gate_proj|up_proj|down_proj}: stacked at load;
- transformers 5.x's fused in-memory names: model.layers.N.mlp.experts.gate_up_proj [E, 2I, H]
  and down_proj [E, H, I] (Mixtral's block_sparse_moe renamed to mlp).
Our parameters are experts.w13 / experts.w2 in that fused layout; hf_state_dict gives HF's names.
"""
from __future__ import annotations

import re
from typing import Any, Iterator

import torch
from torch import nn

from tritongen.models.arch import ModelArch
from tritongen.models.llama import Linear, LlamaForCausalLM
from tritongen.ops import moe

# Hub per-expert names: (layer prefix up to "experts", expert index, projection).
_PER_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")
_PART = {"w1": ("w13", 0), "w3": ("w13", 1), "w2": ("w2", 0),
         "gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", 0)}
_HF_FUSED = {"gate_up_proj": "w13", "down_proj": "w2"}


class Experts(nn.Module):
    """Every expert's gated MLP weights, stacked: w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I]."""

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        e, h, i = arch.num_experts, arch.hidden_size, arch.moe_intermediate_size
        self.w13 = nn.Parameter(torch.empty(e, 2 * i, h))
        self.w2 = nn.Parameter(torch.empty(e, h, i))


class SparseMoeBlock(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.top_k = arch.num_experts_per_tok
        self.renormalize = arch.norm_topk_prob
        self.gate = Linear(arch.hidden_size, arch.num_experts, bias=False)
        self.experts = Experts(arch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = moe.select_experts(self.gate(x), self.top_k, self.renormalize)
        return moe.fused_experts(x, self.experts.w13, self.experts.w2, weights, ids)


class MoEForCausalLM(LlamaForCausalLM):
    """Mixtral and Qwen3-MoE; implements models.interface.CausalLM."""

    def __init__(self, arch: ModelArch) -> None:
        super().__init__(arch)
        for i, layer in enumerate(self.model.layers):
            if arch.is_moe_layer(i):
                layer.mlp = SparseMoeBlock(arch)
        self._pending: dict[str, dict[tuple[int, int], torch.Tensor]] = {}
        """Per-expert checkpoint tensors of a stacked parameter, until all of its pieces arrived."""

    def checkpoint_tensors(self, name: str, tensor: Any) -> Iterator[tuple[str, Any]]:
        name = name.replace(".block_sparse_moe.", ".mlp.")  # Mixtral's Hub name of the MoE block
        m = _PER_EXPERT.match(name)
        if m is None:
            prefix, _, leaf = name.rpartition(".")
            if prefix.endswith(".mlp.experts") and leaf in _HF_FUSED:
                yield f"{prefix}.{_HF_FUSED[leaf]}", tensor
            else:
                yield name, tensor
            return
        prefix, expert, proj = m.group(1), int(m.group(2)), m.group(3)
        target, half = _PART[proj]
        key = f"{prefix}.{target}"
        pieces = self._pending.setdefault(key, {})
        pieces[(expert, half)] = tensor if isinstance(tensor, torch.Tensor) else tensor[:]
        halves = 2 if target == "w13" else 1
        if len(pieces) == self.arch.num_experts * halves:
            del self._pending[key]
            yield key, torch.stack([torch.cat([pieces[(e, j)] for j in range(halves)])
                                    for e in range(self.arch.num_experts)])

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """HF transformers 5.x's in-memory names: experts.gate_up_proj / experts.down_proj."""
        names = {v: k for k, v in _HF_FUSED.items()}
        out = {}
        for name, t in self.state_dict().items():
            prefix, _, leaf = name.rpartition(".")
            out[f"{prefix}.{names[leaf]}" if prefix.endswith(".mlp.experts") else name] = t
        return out
