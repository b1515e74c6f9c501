"""The paged KV cache's element type and, for an fp8 cache, each layer's scales.

`kv_cache_dtype="auto"` keeps the model dtype. "fp8" stores float8 e4m3 (one byte per element),
x / scale with a k_scale and a v_scale per layer (ops/attention_metadata.py says how the attention
implementations read them). The scales come from the checkpoint under the names FP8 checkpoints
publish them with (vLLM's, compressed-tensors', ModelOpt's):
  <layer>.self_attn.k_scale / v_scale              (vLLM, llm-compressor's kv_cache_scheme)
  <layer>.self_attn.k_proj.k_scale / v_proj.v_scale (ModelOpt)
  <layer>.self_attn.k_proj.output_scale / v_proj.output_scale (older compressed-tensors)
read from safetensors files only (a .bin checkpoint's are not looked for); a layer without them
gets 1.0. A scale with more than one element (per head) is replaced by its largest element, as one
scale per tensor is what the kernels take.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Optional

import torch

from tritongen.config import CacheConfig
from tritongen.ops.attention_metadata import FP8_KV_DTYPE

logger = logging.getLogger(__name__)

_SCALE_NAME = re.compile(
    r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.(?:self_attn|attn|attention|self_attention)\."
    r"(?:(?P<proj>[kv])_proj\.(?:(?P=proj)_scale|output_scale)|(?P<plain>[kv])_scale)$")


def resolve_kv_cache_dtype(cache: CacheConfig, model_dtype: torch.dtype, device: torch.device,
                           attention_backend: str) -> torch.dtype:
    """The cache's torch dtype; ValueError where an fp8 cache cannot work: the Triton kernels
    convert to float8 e4m3 in hardware, which needs compute capability 8.9 (Ada, Hopper) or later.
    The reference implementation runs anywhere (torch converts float8 on CPU and on any GPU)."""
    if not cache.fp8_kv_cache:
        return model_dtype
    if device.type == "cuda" and attention_backend == "triton":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            raise ValueError(f"kv_cache_dtype {cache.kv_cache_dtype!r} with the Triton kernels needs a GPU of compute "
                             f"capability 8.9 or later (Ada, Hopper); {torch.cuda.get_device_name(device)} is "
                             f"{major}.{minor}. Use kv_cache_dtype 'auto' (or attention_backend 'reference').")
    return FP8_KV_DTYPE


def layer_of(name: str) -> Optional[tuple[int, str]]:
    """(layer index, "k" | "v") of a checkpoint tensor holding a KV-cache scale, else None."""
    m = _SCALE_NAME.search(name)
    if m is None:
        return None
    return int(m.group(1)), m.group("proj") or m.group("plain")


def checkpoint_kv_scales(model_path: str, num_layers: int) -> list[tuple[float, float]]:
    """(k_scale, v_scale) of every layer from the checkpoint in `model_path`; 1.0 where it has none
    (dummy models, checkpoints without scales)."""
    found: dict[tuple[int, str], float] = {}
    path = Path(model_path).expanduser()
    for file in sorted(path.glob("*.safetensors")) if path.is_dir() else []:
        from safetensors import safe_open

        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                where = layer_of(name)
                if where is None or where[0] >= num_layers:
                    continue
                t = f.get_tensor(name).to(torch.float32)
                if t.numel() > 1:
                    logger.warning("%s has %d KV-cache scales; using their largest for the whole tensor", name,
                                   t.numel())
                found[where] = float(t.abs().max())
    if found:
        logger.info("fp8 KV cache: scales for %d of %d layers from the checkpoint", len({i for i, _ in found}),
                    num_layers)
    return [(found.get((i, "k"), 1.0), found.get((i, "v"), 1.0)) for i in range(num_layers)]
