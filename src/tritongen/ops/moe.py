"""Mixture-of-Experts ops: top-k routing and the routed experts' gated MLPs.

`select_experts` is one formula everywhere (softmax in float32 over the router logits, the top k,
renormalized to sum 1 where the config says so: always for Mixtral, Qwen3-MoE's norm_topk_prob), one
Triton kernel on CUDA.
`fused_experts` runs on CUDA as the Triton grouped GEMM of ops/triton_moe.py (no Python loop over
experts, CUDA-graph safe); elsewhere as `fused_experts_ref`, the test oracle, which loops over the
experts that received tokens like HF transformers' eager experts.

Weight layouts (HF transformers 5.x's fused experts): w13 [E, 2I, H] (each expert's gate rows,
then its up rows), w2 [E, H, I].
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [T, k], expert ids int64 [T, k]) of each token's top-k experts, the largest
    first: one Triton kernel on CUDA (ops/triton_moe.py), select_experts_ref elsewhere."""
    if router_logits.is_cuda:
        from tritongen.ops import triton_moe

        return triton_moe.select_experts(router_logits, top_k, renormalize)
    return select_experts_ref(router_logits, top_k, renormalize)


def select_experts_ref(router_logits: torch.Tensor, top_k: int, renormalize: bool
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The routing in torch ops (softmax, topk, renormalization): the kernel's oracle."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor) -> torch.Tensor:
    """sum_j topk_weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t)), e = topk_ids[t, j]: [T, H]."""
    if x.is_cuda:
        from tritongen.ops import triton_moe

        return triton_moe.fused_experts(x, w13, w2, topk_weights, topk_ids)
    return fused_experts_ref(x, w13, w2, topk_weights, topk_ids)


def fused_experts_ref(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor) -> torch.Tensor:
    """The reference: per expert that received tokens, its tokens' gated MLP, weighted, added in
    x.dtype in expert order (HF's eager experts do the same sums)."""
    out = torch.zeros_like(x)
    num_experts = w13.shape[0]
    hit = torch.bincount(topk_ids.flatten(), minlength=num_experts).nonzero().flatten().tolist()
    for e in hit:
        token, slot = torch.where(topk_ids == e)
        gate, up = F.linear(x[token], w13[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w2[e]) * topk_weights[token, slot, None]
        out.index_add_(0, token, y.to(x.dtype))
    return out
