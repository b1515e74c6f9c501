"""Write an FP8 checkpoint from a bf16/fp16/fp32 one, in either published format: HF's "fp8"
method (block-wise `weight_scale_inv`) or compressed-tensors "float-quantized" (channel, tensor or
block `weight_scale`, dynamic per-token activations). Loads back through our loader and through
transformers (FineGrainedFP8Config(dequantize=True) / CompressedTensorsConfig).

Every 2-D `*.weight` of a linear projection is quantized except those the skip list names
(lm_head by default); embeddings, norms and biases are copied unchanged.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Iterable, Optional

from tritongen.ops.fp8 import Fp8Scales, quantize_weight

FORMATS = ("hf-fp8", "compressed-tensors")
_NOT_LINEAR = ("embed", "wte", "wpe", "norm", "ln_", "word_embeddings")


def _is_linear_weight(name: str, shape: tuple[int, ...], skip: Iterable[str]) -> bool:
    if not name.endswith(".weight") or len(shape) != 2:
        return False
    module = name[: -len(".weight")]
    leaf = module.rsplit(".", 1)[-1]
    return not any(s in leaf for s in _NOT_LINEAR) and not any(module == s or module.endswith("." + s) for s in skip)


def quantization_config(fmt: str, scales: Fp8Scales, skip: list[str]) -> dict:
    """config.json `quantization_config` of an FP8 checkpoint in `fmt`."""
    if fmt == "hf-fp8":
        if scales.kind != "block":
            raise ValueError("the hf-fp8 format stores block scales only")
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": list(scales.block),
                "modules_to_not_convert": skip}
    if fmt != "compressed-tensors":
        raise ValueError(f"fp8 checkpoint format must be one of {FORMATS}, got {fmt!r}")
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "group_size": None,
               "strategy": scales.kind}
    if scales.block:
        weights["block_structure"] = list(scales.block)
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "ignore": skip,
            "config_groups": {"group_0": {
                "targets": ["Linear"], "format": "float-quantized", "weights": weights,
                "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": True,
                                      "strategy": "token", "group_size": None},
                "output_activations": None}}}


def write_fp8_checkpoint(src: str | Path, out: str | Path, fmt: str = "compressed-tensors",
                         scales: Fp8Scales = Fp8Scales("channel"), skip: Optional[list[str]] = None) -> Path:
    """Quantize the safetensors checkpoint in `src` into `out` (config.json with quantization_config,
    model.safetensors, tokenizer and other small files copied). Returns `out`."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    src, out = Path(src), Path(out)
    skip = list(skip if skip is not None else ["lm_head"])
    qconfig = quantization_config(fmt, scales, skip)
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{src} has no .safetensors files to quantize")
    config = json.loads((src / "config.json").read_text())
    if "quantization_config" in config:
        raise ValueError(f"{src} is already quantized ({config['quantization_config'].get('quant_method')!r})")
    scale_name = "weight_scale_inv" if fmt == "hf-fp8" else "weight_scale"
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), "pt") as reader:
            for name in reader.keys():
                t = reader.get_tensor(name)
                if _is_linear_weight(name, tuple(t.shape), skip):
                    q, s = quantize_weight(t, scales)
                    tensors[name] = q
                    # compressed-tensors keeps per-channel scales as [N, 1] and per-tensor as [1]
                    if fmt == "compressed-tensors" and scales.kind != "block":
                        s = s.reshape(-1, 1) if scales.kind == "channel" else s.reshape(1)
                    tensors[name[: -len("weight")] + scale_name] = s.contiguous()
                else:
                    tensors[name] = t
    out.mkdir(parents=True, exist_ok=True)
    for extra in src.iterdir():
        if extra.is_file() and extra.suffix != ".safetensors" and extra.name not in ("config.json",) \
                and not extra.name.endswith(".index.json"):
            shutil.copy2(extra, out / extra.name)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config["quantization_config"] = qconfig
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
