"""FP8 (e4m3) linear layers: quantization, the scale layouts of published FP8 checkpoints, and the
reference product every FP8 kernel is checked against.

A weight is stored as float8_e4m3fn [N, K] with float32 scales so that `w ≈ q * scale`, in one of
three layouts (`Fp8Scales.kind`):
- "channel": one scale per output row, [N] (what `--quantization fp8` makes from a bf16 checkpoint);
- "tensor": one scale for the whole weight, [] (compressed-tensors' per-tensor strategy);
- "block": one scale per (block_n x block_k) tile, [ceil(N/bn), ceil(K/bk)] (HF's "fp8" method with
  `weight_block_size`, stored there as `weight_scale_inv`, and compressed-tensors' block strategy).
Activations are quantized per token at run time (`dynamic`), or left in bf16 (weight-only, where a
skinny decode GEMM reads the weight bytes and upcasts in registers).

On the CPU every product is the reference (weights dequantized to float32, activations as given).
On CUDA (`fp8_linear`): decode-sized inputs (at most WEIGHT_ONLY_ROWS rows) and block-scaled
weights run a Triton kernel (ops/triton_fp8.py), the one select_configs measured fastest for the
layer's shape and row bucket: weight-only (the fp8 bytes read once and upcast in registers) or,
for per-channel and per-tensor scales, the tokens quantized first and fp8 x fp8 on the tensor
cores; larger channel/tensor-scaled products quantize the activations per token and run on the
FP8 tensor cores (torch._scaled_mm with row-wise scales).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import nn

from tritongen.ops.fp8_scales import E4M3_MAX, E4M3_MAX_RECIPROCAL, MIN_SCALE, Fp8Scales

E4M3 = torch.float8_e4m3fn
WEIGHT_ONLY_ROWS = 16


def quantize_weight(w: torch.Tensor, scales: Fp8Scales = Fp8Scales("channel")) -> tuple[torch.Tensor, torch.Tensor]:
    """(q float8_e4m3fn [N, K], scale float32) with w ≈ q * scale, the scale chosen so that each
    group's largest magnitude maps to E4M3_MAX."""
    if w.dim() != 2:
        raise ValueError(f"fp8 weights are 2-D, got shape {tuple(w.shape)}")
    w32 = w.float()
    n, k = w32.shape
    if scales.kind == "channel":
        scale = (w32.abs().amax(dim=1) / E4M3_MAX).clamp(min=MIN_SCALE)
        return (w32 / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale
    if scales.kind == "tensor":
        scale = (w32.abs().amax() / E4M3_MAX).clamp(min=MIN_SCALE)
        return (w32 / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale
    bn, bk = scales.block
    sn, sk = scales.shape(n, k)
    padded = torch.zeros(sn * bn, sk * bk, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w32
    tiles = padded.view(sn, bn, sk, bk)
    scale = (tiles.abs().amax(dim=(1, 3)) / E4M3_MAX).clamp(min=MIN_SCALE)
    q = (tiles / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).view(sn * bn, sk * bk)[:n, :k]
    return q.to(E4M3).contiguous(), scale


def expand_scales(scale: torch.Tensor, scales: Fp8Scales, n: int, k: int) -> torch.Tensor:
    """The per-element scale [N, K] (float32) of a weight's scale tensor, or a broadcastable view."""
    want = scales.shape(n, k)
    if tuple(scale.shape) != want and not (scales.kind == "tensor" and scale.numel() == 1):
        raise ValueError(f"fp8 {scales.kind} scales of an [{n}, {k}] weight have shape {list(want)}, "
                         f"got {list(scale.shape)}")
    s = scale.float()
    if scales.kind == "channel":
        return s[:, None]
    if scales.kind == "tensor":
        return s.reshape(())
    bn, bk = scales.block
    return s.repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]


def dequantize_weight(q: torch.Tensor, scale: torch.Tensor, scales: Fp8Scales) -> torch.Tensor:
    """float32 [N, K] weight of an fp8 one."""
    n, k = q.shape
    return q.float() * expand_scales(scale, scales, n, k)


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token activation quantization: (q [M, K] e4m3, scale float32 [M, 1])."""
    x32 = x.float()
    scale = (x32.abs().amax(dim=-1, keepdim=True) * E4M3_MAX_RECIPROCAL).clamp(min=MIN_SCALE)
    return (x32 / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def fp8_linear_ref(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, scales: Fp8Scales,
                   bias: Optional[torch.Tensor] = None, dynamic: bool = True) -> torch.Tensor:
    """x @ dequant(q).T (+ bias) in float32, returned in x's dtype. `dynamic`: x is quantized per
    token first, as the FP8 tensor-core GEMM sees it; else it is used as given (weight-only)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if dynamic:
        xq, xs = quantize_tokens(x2)
        xf = xq.float() * xs
    else:
        xf = x2.float()
    out = xf @ dequantize_weight(q, scale, scales).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).reshape(*shape[:-1], q.shape[0])


class Fp8Tokens(NamedTuple):
    """Activations quantized per token by the op that produced them (the RMSNorm before a stacked
    fp8 projection, SiLU·mul before down_proj: ops.kernels.rms_norm_fp8, add_rms_norm_fp8,
    silu_and_mul_fp8), what quantize_tokens would make of them; Fp8Linear.forward takes them."""

    q: torch.Tensor
    """float8_e4m3fn [T, K]."""
    scale: torch.Tensor
    """float32 [T, 1]."""
    dtype: torch.dtype
    """The activations' dtype: the product's output dtype."""

    @property
    def shape(self) -> torch.Size:
        return self.q.shape


def fp8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, scales: Fp8Scales,
               bias: Optional[torch.Tensor] = None, configs: Optional[dict] = None) -> torch.Tensor:
    """x @ dequant(q).T (+ bias) on the device's path (see the module docstring); `configs`: the
    layer's measured tilings per row bucket (ops.triton_fp8.select_configs)."""
    if not x.is_cuda:
        return fp8_linear_ref(x, q, scale, scales, bias, dynamic=False)
    rows = x.numel() // x.shape[-1]
    if rows <= WEIGHT_ONLY_ROWS or scales.kind == "block":
        from tritongen.ops import triton_fp8

        config = configs.get(triton_fp8.row_bucket(rows)) if configs else None
        return triton_fp8.fp8_linear(x, q, scale, scales, bias, config)
    return _scaled_mm_linear(x, q, scale, scales, bias)


def _scaled_mm_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, scales: Fp8Scales,
                      bias: Optional[torch.Tensor]) -> torch.Tensor:
    from tritongen.ops import triton_fp8_quant

    shape = x.shape
    xq, xs = triton_fp8_quant.quantize_tokens(x.reshape(-1, shape[-1]))  # quantize_tokens in one launch
    n = q.shape[0]
    w_scale = scale.float().reshape(1, n) if scales.kind == "channel" else scale.float().reshape(1, 1).expand(1, n)
    out = torch._scaled_mm(xq, q.t(), scale_a=xs, scale_b=w_scale.contiguous(), out_dtype=x.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*shape[:-1], n)


class Fp8Linear(nn.Module):
    """A linear layer with an fp8 weight ("weight", float8_e4m3fn [out, in]) and its float32
    "weight_scale" in the layout `scales` says; the bias (if any) stays in the model dtype."""

    def __init__(self, in_features: int, out_features: int, bias: bool, scales: Fp8Scales,
                 dtype: Optional[torch.dtype] = None, device: Optional[torch.device] = None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.scales = scales
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=E4M3, device=device),
                                   requires_grad=False)
        self.weight_scale = nn.Parameter(torch.ones(scales.shape(out_features, in_features),
                                                    dtype=torch.float32, device=device), requires_grad=False)
        self.bias = (nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device), requires_grad=False)
                     if bias else None)
        self.kernel_configs: dict[int, dict] = {}
        """CUDA: the Triton kernel's tiling per row bucket, measured at load (triton_fp8.select_configs)."""
        self.producer: Optional[str] = None
        """The op before this layer where it can write this layer's input quantized per token
        (Fp8Tokens): "rms_norm" (the residual add and RMSNorm) or "silu_mul". select_configs then
        times every candidate after that op, its quantizing variant before a quantized-token
        configuration and its plain one before the others, so the quantizing epilogue's own cost
        counts in the choice."""

    @classmethod
    def from_linear(cls, linear: nn.Linear, scales: Fp8Scales = Fp8Scales("channel")) -> "Fp8Linear":
        """Quantize a loaded linear layer's weight (bf16/fp16/fp32) into a new Fp8Linear."""
        w = linear.weight.detach()
        out = cls(linear.in_features, linear.out_features, linear.bias is not None, scales,
                  dtype=w.dtype, device=w.device)
        q, s = quantize_weight(w, scales)
        with torch.no_grad():
            out.weight.copy_(q)
            out.weight_scale.copy_(s)
            if linear.bias is not None:
                out.bias.copy_(linear.bias.detach())
        return out

    def takes_tokens(self, x: torch.Tensor) -> bool:
        """Whether this layer's decode kernel for x's row count takes quantized tokens (select_configs
        chose a QUANT configuration), so its producer may hand it Fp8Tokens instead of x."""
        rows = x.numel() // x.shape[-1]
        if not (x.is_cuda and self.kernel_configs and rows <= WEIGHT_ONLY_ROWS):
            return False
        from tritongen.ops import triton_fp8

        return bool(self.kernel_configs.get(triton_fp8.row_bucket(rows), {}).get("QUANT"))

    def forward(self, x: torch.Tensor | Fp8Tokens) -> torch.Tensor:
        if isinstance(x, Fp8Tokens):  # only where takes_tokens said so
            from tritongen.ops import triton_fp8

            config = self.kernel_configs[triton_fp8.row_bucket(x.q.shape[0])]
            return triton_fp8.fp8_tokens_linear(x.q, x.scale, self.weight, self.weight_scale, self.scales, self.bias,
                                                config, x.dtype)
        return fp8_linear(x, self.weight, self.weight_scale, self.scales, self.bias, self.kernel_configs)

    def extra_repr(self) -> str:
        block = f", block={self.scales.block}" if self.scales.block else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"scales={self.scales.kind}{block}, bias={self.bias is not None}")


def stack_fp8(layers: list["Fp8Linear"]) -> "Fp8Linear":
    """One Fp8Linear computing the layers' outputs side by side (q/k/v, gate/up stacked into one
    GEMM). Per-tensor scales become per-channel ones (each layer's scale repeated over its rows);
    block scales stack when every layer's row count is a multiple of the block height."""
    first = layers[0]
    kinds = {layer.scales for layer in layers}
    if len(kinds) != 1:
        raise ValueError(f"cannot stack fp8 layers with different scale layouts: {sorted(k.kind for k in kinds)}")
    scales = first.scales
    if scales.kind == "block" and any(layer.out_features % scales.block[0] for layer in layers):
        raise ValueError(f"cannot stack fp8 layers of {[layer.out_features for layer in layers]} rows with "
                         f"block scales of height {scales.block[0]}")
    if scales.kind == "tensor":
        scale = torch.cat([layer.weight_scale.reshape(1).expand(layer.out_features) for layer in layers])
        scales = Fp8Scales("channel")
    else:
        scale = torch.cat([layer.weight_scale for layer in layers])
    out = Fp8Linear(first.in_features, sum(layer.out_features for layer in layers), first.bias is not None, scales,
                    dtype=first.bias.dtype if first.bias is not None else None, device=first.weight.device)
    with torch.no_grad():
        out.weight.copy_(torch.cat([layer.weight for layer in layers]))
        out.weight_scale.copy_(scale)
        if first.bias is not None:
            out.bias.copy_(torch.cat([layer.bias for layer in layers]))
    return out
