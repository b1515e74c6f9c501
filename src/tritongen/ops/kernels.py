"""Dispatch of the per-token ops (RMSNorm, residual add + RMSNorm, rotary, SiLU·mul) and of the
linear layers: the reference (torch), or for CUDA tensors the Triton kernels once `use_triton(True)`
was called (select_attention_backend does it). Linear layers take the Triton skinny GEMM only for
decode-sized inputs (at most triton_gemv.MAX_ROWS rows) of weight shapes where
triton_gemv.select_kernels measured it faster at load; everything else stays on cuBLAS. The MLP's
stacked gate/up projection and its SiLU·mul likewise run as one kernel (gated_linear) where
select_gated_kernels measured that faster."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from tritongen.ops import reference

_impl = reference
_gemv = None


def use_triton(enabled: bool) -> None:
    global _impl, _gemv
    if enabled:
        from tritongen.ops import triton_elementwise, triton_gemv

        _impl, _gemv = triton_elementwise, triton_gemv
    else:
        _impl, _gemv = reference, None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear; with `out` (x 2-D, out [rows, N] contiguous) the product is written there."""
    if _gemv is not None and x.is_cuda:
        rows = x.numel() // x.shape[-1]
        cfg = _gemv.config_for(weight, rows) if rows <= _gemv.MAX_ROWS else None
        if cfg is not None:
            return _gemv.linear(x, weight, cfg, bias, out=out)
    if out is None:
        return F.linear(x, weight, bias)
    if bias is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(bias, x, weight.t(), out=out)


def single_pass_gemm_config(weight: torch.Tensor, rows: int) -> Optional[dict]:
    """The skinny GEMM's fastest single-pass configuration measured for this weight and row count, for
    kernels that fuse more work after that GEMM; None without the Triton kernels or a measurement."""
    if _gemv is None or not weight.is_cuda or rows > _gemv.BLOCK_M:
        return None
    return _gemv.single_pass_config_for(weight, rows)


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


def gated_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """silu(gate) * up of a stacked gate/up projection (weight [2N, K]: gate rows, then up rows):
    one fused kernel for decode batches where triton_gemv.select_gated_kernels measured it faster,
    else the GEMM and the SiLU·mul kernel."""
    if _gemv is not None and x.is_cuda and bias is None:
        rows = x.numel() // x.shape[-1]
        cfg = _gemv.gated_config_for(weight, rows) if rows <= _gemv.MAX_ROWS else None
        if cfg is not None:
            return _gemv.gated_linear(x, weight, cfg)
    gate, up = linear(x, weight, bias).chunk(2, dim=-1)
    return silu_and_mul(gate, up)
