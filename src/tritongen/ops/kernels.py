"""Dispatch of the per-token ops (RMSNorm, residual add + RMSNorm, rotary, SiLU·mul): the reference, or for CUDA tensors
the Triton kernels once `use_triton(True)` was called (select_attention_backend does it)."""
from __future__ import annotations

import torch

from tritongen.ops import reference

_impl = reference


def use_triton(enabled: bool) -> None:
    global _impl
    if enabled:
        from tritongen.ops import triton_elementwise

        _impl = triton_elementwise
    else:
        _impl = reference


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return (_impl if x.is_cuda else reference).rms_norm(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    return (_impl if x.is_cuda else reference).add_rms_norm(x, residual, weight, eps)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    return (_impl if q.is_cuda else reference).apply_rotary(q, k, cos, sin)


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return (_impl if gate.is_cuda else reference).silu_and_mul(gate, up)
