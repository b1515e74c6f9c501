"""Which linear layers of a model are FP8 and how their scales are stored: read from a checkpoint's
`quantization_config` (pre-quantized checkpoints) or asked for with `quantization="fp8"` on a
bf16/fp16 one, and applied by swapping the model's linear layers for ops.fp8.Fp8Linear.

Formats read (config.json `quantization_config`):
- HF's "fp8" method (FineGrainedFP8): `weight` float8_e4m3fn with `weight_scale_inv` of
  `weight_block_size` tiles (w = q * weight_scale_inv), activations dynamic; `modules_to_not_convert`.
- compressed-tensors "float-quantized" (llm-compressor's FP8 schemes): `weight` float8_e4m3fn with
  `weight_scale` per channel ([N, 1]), per tensor ([1]) or per block (`block_structure`);
  activations dynamic per token (static `input_scale` ones are refused); `ignore` lists modules by
  name or `re:` pattern; `targets` must be Linear.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Optional

from torch import nn

from tritongen.ops.fp8 import Fp8Linear, Fp8Scales

QUANTIZATIONS = (None, "fp8")
"""Values of the engine's `quantization` option: None keeps the checkpoint's dtype (or its own
quantization_config); "fp8" quantizes a bf16/fp16 checkpoint's linear layers at load."""
DEFAULT_SKIP = ("lm_head",)
"""Linear layers left in the model dtype unless asked (the embeddings are never linear layers)."""


@dataclass(frozen=True)
class Fp8Plan:
    """How to make and fill the FP8 linear layers of one model."""

    scales: Fp8Scales
    scale_suffix: Optional[str]
    """The checkpoint's name for the weight scale ("weight_scale_inv", "weight_scale"); None when
    the weights are quantized at load from a bf16/fp16 checkpoint."""
    skip: tuple[str, ...] = DEFAULT_SKIP
    """Modules left unquantized: a name (matching the full name or its last parts) or "re:<pattern>"
    (re.match against the full name, as compressed-tensors reads its `ignore` list)."""

    @property
    def prequantized(self) -> bool:
        return self.scale_suffix is not None

    def skips(self, name: str) -> bool:
        for pattern in self.skip:
            if pattern.startswith("re:"):
                if re.match(pattern[3:], name):
                    return True
            elif name == pattern or name.endswith("." + pattern):
                return True
        return False


def plan_for(hf_config: dict, quantization: Optional[str], quantize_lm_head: bool = False) -> Optional[Fp8Plan]:
    """The FP8 plan of a checkpoint (its quantization_config) and the `quantization` option; None
    for a plain model. `quantize_lm_head` (with quantization "fp8" on a checkpoint without a
    quantization_config) leaves no layer out. ValueError names what is unsupported."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {[q for q in QUANTIZATIONS if q]} or unset, got {quantization!r}")
    qc = hf_config.get("quantization_config")
    if quantize_lm_head and (quantization != "fp8" or qc is not None):
        raise ValueError("quantize_lm_head applies to quantization='fp8' on a bf16/fp16 checkpoint"
                         + ("; this one is pre-quantized and its quantization_config names the layers left out"
                            if qc is not None else f", got quantization={quantization!r}"))
    if qc is None:
        if quantization != "fp8":
            return None
        return Fp8Plan(Fp8Scales("channel"), scale_suffix=None, skip=() if quantize_lm_head else DEFAULT_SKIP)
    if not isinstance(qc, dict):
        raise ValueError("config.json quantization_config must be an object")
    method = qc.get("quant_method")
    if method == "fp8":
        return _hf_fp8(qc)
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    raise ValueError(f"unsupported quantization_config quant_method {method!r}; supported: 'fp8', 'compressed-tensors'"
                     " (float-quantized)")


def _hf_fp8(qc: dict) -> Fp8Plan:
    if qc.get("activation_scheme", "dynamic") != "dynamic":
        raise ValueError(f"fp8 checkpoints with activation_scheme {qc.get('activation_scheme')!r} are not supported"
                         " (only 'dynamic')")
    block = qc.get("weight_block_size")
    if block is None:
        raise ValueError("fp8 quantization_config without weight_block_size is not supported")
    skip = tuple(qc.get("modules_to_not_convert") or ()) or DEFAULT_SKIP
    return Fp8Plan(Fp8Scales("block", _pair(block, "weight_block_size")), "weight_scale_inv", skip)


def _compressed_tensors(qc: dict) -> Fp8Plan:
    fmt = qc.get("format")
    if fmt != "float-quantized":
        raise ValueError(f"compressed-tensors format {fmt!r} is not supported (only 'float-quantized', FP8)")
    groups = qc.get("config_groups") or {}
    if len(groups) != 1:
        raise ValueError(f"compressed-tensors checkpoints with {len(groups)} config_groups are not supported (one)")
    group = next(iter(groups.values()))
    if list(group.get("targets", [])) != ["Linear"]:
        raise ValueError(f"compressed-tensors targets {group.get('targets')!r} are not supported (['Linear'])")
    w, a = group.get("weights") or {}, group.get("input_activations")
    if w.get("type") != "float" or w.get("num_bits") != 8:
        raise ValueError(f"compressed-tensors weights of type {w.get('type')!r} with {w.get('num_bits')} bits"
                         " are not supported (8-bit float)")
    strategy = w.get("strategy")
    if strategy == "block":
        scales = Fp8Scales("block", _pair(w.get("block_structure"), "block_structure"))
    elif strategy in ("channel", "tensor"):
        scales = Fp8Scales(strategy)
    else:
        raise ValueError(f"compressed-tensors weight strategy {strategy!r} is not supported (channel, tensor, block)")
    if a is None:
        raise ValueError("compressed-tensors FP8 weight-only checkpoints (no input_activations) are not supported")
    if not a.get("dynamic"):
        raise ValueError("compressed-tensors FP8 checkpoints with static activation scales are not supported"
                         " (only dynamic per-token activations)")
    if a.get("strategy") not in ("token", None):
        raise ValueError(f"dynamic activation strategy {a.get('strategy')!r} is not supported (token)")
    return Fp8Plan(scales, "weight_scale", tuple(qc.get("ignore") or ()))


def _pair(value: Any, what: str) -> tuple[int, int]:
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        raise ValueError(f"{what} must be two positive integers, got {value!r}")
    return int(value[0]), int(value[1])


def fp8_linear_names(model: nn.Module, plan: Fp8Plan) -> list[str]:
    """Names of the linear layers that the plan makes FP8."""
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear) and not plan.skips(name)]


def make_fp8_layers(model: nn.Module, plan: Fp8Plan) -> list[str]:
    """Replace the plan's linear layers by empty Fp8Linear ones (on the layer's device, meta
    included), to be filled from a pre-quantized checkpoint; returns their names. A tied lm_head
    is the embedding table (the checkpoint stores no weight of its own for it) and stays with it,
    whatever the plan's skip list says."""
    tied = getattr(getattr(model, "arch", None), "tie_word_embeddings", False)
    names = [n for n in fp8_linear_names(model, plan) if not (tied and n == "lm_head")]
    for name in names:
        old = model.get_submodule(name)
        new = Fp8Linear(old.in_features, old.out_features, old.bias is not None, plan.scales,
                        dtype=old.weight.dtype, device=old.weight.device)
        _set_submodule(model, name, new)
    return names


def quantize_layers(model: nn.Module, plan: Fp8Plan) -> list[str]:
    """Quantize the plan's loaded linear layers in place (bf16/fp16 weights -> Fp8Linear)."""
    names = fp8_linear_names(model, plan)
    for name in names:
        _set_submodule(model, name, Fp8Linear.from_linear(model.get_submodule(name), plan.scales))
    return names


def checkpoint_name(name: str, plan: Fp8Plan) -> str:
    """Our parameter name of a checkpoint tensor: the format's scale name becomes `weight_scale`."""
    if plan.scale_suffix and name.endswith("." + plan.scale_suffix):
        return name[: -len(plan.scale_suffix)] + "weight_scale"
    return name


def checkpoint_scale(tensor, plan: Fp8Plan, n: int, k: int):
    """A checkpoint's weight scale in our layout (compressed-tensors stores per-channel scales as
    [N, 1] and per-tensor ones as [1]); ValueError when it holds the wrong number of scales."""
    want = plan.scales.shape(n, k)
    if tensor.numel() != math.prod(want):
        raise ValueError(f"fp8 {plan.scales.kind} scales of an [{n}, {k}] weight must hold {list(want)},"
                         f" the checkpoint has {list(tensor.shape)}")
    return tensor.float().reshape(want)


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)
