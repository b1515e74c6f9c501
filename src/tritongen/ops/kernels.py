"""Dispatch of the per-token ops (RMSNorm and LayerNorm, each alone or fused with the residual add
before it, rotary, SiLU·mul) and of the linear layers: the reference (torch), or for CUDA tensors
the Triton kernels.

What one engine runs is a `KernelChoices`: whether the Triton kernels are on, and which decode
GEMMs take the Triton skinny GEMM (triton_gemv.select_kernels measured it faster on that model's
weights at load) or the stacked gate/up GEMM with SiLU·mul fused (select_gated_kernels). The
engine's runner makes it active around its forward passes (`active`), so two engines in one
process keep their own choices; outside any `active` block the process default applies, which
`use_triton` sets (select_attention_backend does it). Linear layers take the skinny GEMM only for
decode-sized inputs (at most triton_gemv.MAX_ROWS rows) of the shapes chosen; everything else stays
on cuBLAS."""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Iterator, Optional

import torch
import torch.nn.functional as F

from tritongen.ops import reference
from tritongen.ops.fp8 import Fp8Tokens, quantize_tokens


@dataclass
class KernelChoices:
    """The kernels of one engine's model (CUDA tensors; CPU tensors always take the reference)."""

    triton: bool = False
    """The Triton per-token kernels and, where `gemm` / `gated` say so, the skinny GEMMs."""
    gemm: dict = field(default_factory=dict)
    """(N, K, dtype, row bucket) -> skinny GEMM configuration, or None for cuBLAS (select_kernels)."""
    gated: dict = field(default_factory=dict)
    """(2N, K, dtype, row bucket) -> fused gate/up + SiLU·mul configuration, or None (select_gated_kernels)."""


_default = KernelChoices()
_active: ContextVar[Optional[KernelChoices]] = ContextVar("tritongen_kernel_choices", default=None)


def use_triton(enabled: bool) -> None:
    """The process default outside any `active` block (no skinny GEMM choices of its own)."""
    _default.triton = enabled


@contextlib.contextmanager
def active(choices: KernelChoices) -> Iterator[KernelChoices]:
    """Dispatch with `choices` in this thread (and its context) until the block ends."""
    token = _active.set(choices)
    try:
        yield choices
    finally:
        _active.reset(token)


def current() -> KernelChoices:
    choices = _active.get()
    return _default if choices is None else choices


def _impl(x: torch.Tensor):
    return _triton("triton_elementwise") if x.is_cuda and current().triton else reference


_modules: dict = {}


def _triton(name: str):
    """ops.triton_elementwise / ops.triton_gemv, imported on first use (they need the triton package)."""
    mod = _modules.get(name)
    if mod is None:
        import importlib

        mod = _modules[name] = importlib.import_module(f"tritongen.ops.{name}")
    return mod


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear; with `out` (x 2-D, out [rows, N] contiguous) the product is written there."""
    choices = current()
    if choices.gemm and x.is_cuda:
        triton_gemv = _triton("triton_gemv")
        rows = x.numel() // x.shape[-1]
        cfg = triton_gemv.config_for(choices.gemm, weight, rows) if rows <= triton_gemv.MAX_ROWS else None
        if cfg is not None:
            return triton_gemv.linear(x, weight, cfg, bias, out=out)
    if out is None:
        return F.linear(x, weight, bias)
    if bias is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(bias, x, weight.t(), out=out)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    """Llama's RMSNorm; `offset` (Gemma: 1.0) scales by (offset + weight) in float32 (reference.rms_norm)."""
    return _impl(x).rms_norm(x, weight, eps, offset)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    return _impl(x).add_rms_norm(x, residual, weight, eps, offset)


def norm_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, next_weight: torch.Tensor,
                      eps: float, offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(s, next_weight), s), s = rms_norm(x, weight) + residual: one kernel on CUDA."""
    return _impl(x).norm_add_rms_norm(x, residual, weight, next_weight, eps, offset)


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> Fp8Tokens:
    """rms_norm's output quantized per token for an fp8 projection that takes it so (Fp8Linear.takes_tokens):
    quantize_tokens(rms_norm(x)), one kernel on CUDA."""
    if x.is_cuda and current().triton:
        return Fp8Tokens(*_triton("triton_elementwise").rms_norm_fp8(x, weight, eps, offset), x.dtype)
    return Fp8Tokens(*quantize_tokens(reference.rms_norm(x, weight, eps, offset).reshape(-1, x.shape[-1])), x.dtype)


def add_rms_norm_fp8(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0
                     ) -> tuple[Fp8Tokens, torch.Tensor]:
    """add_rms_norm with the normalized rows quantized per token (rms_norm_fp8); the sum as usual."""
    if x.is_cuda and current().triton:
        qs, s = _triton("triton_elementwise").add_rms_norm_fp8(x, residual, weight, eps, offset)
        return Fp8Tokens(*qs, x.dtype), s
    y, s = reference.add_rms_norm(x, residual, weight, eps, offset)
    return Fp8Tokens(*quantize_tokens(y.reshape(-1, x.shape[-1])), x.dtype), s


def qk_rms_norm_(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, num_q: int, num_k: int,
                 head_dim: int, eps: float, offset: float = 0.0) -> torch.Tensor:
    """qk-norm (Qwen3, Gemma 3) in place in a stacked q|k|v projection output [T, (num_q + 2·num_k) · head_dim]:
    rms_norm over head_dim of each q head (q_weight) and each k head (k_weight); one kernel on CUDA."""
    if qkv.is_cuda and current().triton:
        return _triton("triton_qk_norm").qk_rms_norm_(qkv, q_weight, k_weight, num_q, num_k, head_dim, eps, offset)
    T, q_size, k_size = qkv.shape[0], num_q * head_dim, num_k * head_dim
    q, k = qkv[:, :q_size], qkv[:, q_size:q_size + k_size]
    q.copy_(reference.rms_norm(q.reshape(T, num_q, head_dim), q_weight, eps, offset).reshape(T, q_size))
    k.copy_(reference.rms_norm(k.reshape(T, num_k, head_dim), k_weight, eps, offset).reshape(T, k_size))
    return qkv


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """nn.LayerNorm over the last dimension (GPT-2, Bloom; reference.layer_norm)."""
    return _impl(x).layer_norm(x, weight, bias, eps)


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(layer_norm(x + residual), x + residual), the sum rounded as the plain add rounds it."""
    return _impl(x).add_layer_norm(x, residual, weight, bias, eps)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    return _impl(q).apply_rotary(q, k, cos, sin)


def activation(x: torch.Tensor, name: str) -> torch.Tensor:
    """The MLP activation `name` (reference.activation); the tanh GELUs in one kernel on CUDA."""
    c0 = reference.TANH_GELU_C0.get(name)
    if c0 is not None and x.is_cuda and current().triton:
        return _triton("triton_elementwise").gelu_tanh(x, c0)
    return reference.activation(x, name)


def activation_and_mul(gate: torch.Tensor, up: torch.Tensor, name: str) -> torch.Tensor:
    """activation(gate) * up (GeGLU and friends); one kernel on CUDA for SiLU and the tanh GELUs."""
    if name in ("silu", "swish"):
        return silu_and_mul(gate, up)
    c0 = reference.TANH_GELU_C0.get(name)
    if c0 is not None and gate.is_cuda and current().triton:
        return _triton("triton_elementwise").gelu_tanh(gate, c0, up)
    return reference.activation(gate, name) * up


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return _impl(gate).silu_and_mul(gate, up)


def silu_and_mul_fp8(gate: torch.Tensor, up: torch.Tensor) -> Fp8Tokens:
    """silu_and_mul's output quantized per token for an fp8 projection that takes it so
    (Fp8Linear.takes_tokens): quantize_tokens(silu_and_mul(gate, up)), one kernel on CUDA."""
    if gate.is_cuda and current().triton:
        return Fp8Tokens(*_triton("triton_elementwise").silu_and_mul_fp8(gate, up), gate.dtype)
    return Fp8Tokens(*quantize_tokens(reference.silu_and_mul(gate, up).reshape(-1, gate.shape[-1])), gate.dtype)


def gated_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """silu(gate) * up of a stacked gate/up projection (weight [2N, K]: gate rows, then up rows):
    one fused kernel for decode batches where select_gated_kernels measured it faster, else the
    GEMM and the SiLU·mul kernel."""
    choices = current()
    if choices.gated and x.is_cuda and bias is None:
        triton_gemv = _triton("triton_gemv")
        rows = x.numel() // x.shape[-1]
        cfg = triton_gemv.config_for(choices.gated, weight, rows) if rows <= triton_gemv.MAX_ROWS else None
        if cfg is not None:
            return triton_gemv.gated_linear(x, weight, cfg)
    gate, up = linear(x, weight, bias).chunk(2, dim=-1)
    return silu_and_mul(gate, up)
