"""Build a model from `dummy:<preset>` (random weights) or an HF directory (config.json + weights).

The model is always built on the meta device and then allocated directly on the target device in
the target dtype, so a 7B model never exists on the CPU and is never initialized twice. Checkpoint
tensors are copied in one at a time (copy_ casts dtype and moves device), shard by shard.
"""
from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Protocol

import torch
from torch import nn

from tritongen.models.arch import ModelArch
from tritongen.models.interface import CausalLM
from tritongen.models.presets import PRESETS
from tritongen.models.registry import get_model_class

if TYPE_CHECKING:
    from tritongen.models.fp8_checkpoint import Fp8Plan

logger = logging.getLogger(__name__)


class TensorSlice(Protocol):
    """The part of a full checkpoint tensor one process keeps (parallel.tensor_parallel.ShardSpec)."""

    def take(self, full: Any) -> torch.Tensor:
        """This part of `full`: a tensor, or a lazy safetensors slice (read only in part)."""


SpecFn = Callable[[str], Optional[TensorSlice]]
"""HF parameter name -> the slice of the full tensor this rank keeps (None: all of it)."""


@dataclass(frozen=True)
class ModelSplit:
    """How to build one part of a model split over processes; the parallelism that applies it
    (parallel.tensor_parallel.model_split) says how, so model code stays single-device."""

    restructure: Callable[[nn.Module], None]
    """Swaps in the part's modules (this rank's shapes) on the meta device, before allocation."""
    spec: SpecFn
    """Which slice of each full, HF-named tensor the part keeps."""

DUMMY_PREFIX = "dummy:"
# Old checkpoints saved the rotary buffer; we recompute it.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)
_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def is_dummy(model: str) -> bool:
    return model.startswith(DUMMY_PREFIX)


def hf_config_dict(model: str) -> dict:
    """The HF config.json dict of `dummy:<preset>` or of an HF model directory (a fresh copy)."""
    if is_dummy(model):
        name = model[len(DUMMY_PREFIX):]
        if name not in PRESETS:
            raise ValueError(f"unknown dummy preset {name!r}; available presets: {', '.join(PRESETS)}")
        return copy.deepcopy(PRESETS[name])
    path = _model_dir(model)
    return json.loads((path / "config.json").read_text())


def read_arch(model: str) -> ModelArch:
    """ModelArch of `model` without loading any weights."""
    return ModelArch.from_hf_config(hf_config_dict(model))


def load_model(
    model: str, dtype: torch.dtype, device: torch.device, seed: int = 0, split: Optional[ModelSplit] = None,
    quantization: Optional[str] = None, quantize_lm_head: bool = False,
) -> tuple[CausalLM, ModelArch]:
    """(model in eval mode on `device` in `dtype`, its arch). Dummy weights are deterministic in seed
    and device type (they are drawn on the device, so CPU and CUDA draws differ).

    FP8 (models/fp8_checkpoint.py): a checkpoint with an FP8 quantization_config gets Fp8Linear
    layers filled from its tensors; `quantization="fp8"` on another one quantizes its linear
    layers once loaded, per output channel (fuse_projections stacks them as they are, which gives
    the same tensors as quantizing the stacks); lm_head too with `quantize_lm_head` (not with a
    `split`: the tensor-parallel lm_head gathers its vocab slices).

    With a `split` (a tensor-parallel rank's), the model has the part's shapes and only the part's
    slice of each tensor is read from the checkpoint (dummy weights: drawn whole one tensor at a time
    and sliced, so every world size gets the same model)."""
    device = torch.device(device)
    arch = read_arch(model)
    plan = fp8_plan(model, quantization, quantize_lm_head)
    if quantize_lm_head and split is not None:
        raise ValueError("quantize_lm_head is not supported with tensor parallelism (lm_head is split over the vocab)")
    prequantized = plan if plan is not None and plan.prequantized else None
    if prequantized is not None and split is not None:
        raise ValueError("FP8 checkpoints load without tensor parallelism for now (their scales are not sharded)")
    net = build_empty_model(arch, dtype, device, split.restructure if split is not None else None, prequantized)
    spec: SpecFn = split.spec if split is not None else lambda name: None
    if is_dummy(model):
        init_dummy_weights(net, seed, spec, full_shapes(arch) if split is not None else None)
    else:
        load_checkpoint(net, Path(model).expanduser(), spec, prequantized)
    if plan is not None and prequantized is None:
        from tritongen.models.fp8_checkpoint import quantize_layers

        logger.info("fp8: %d linear layers quantized per output channel", len(quantize_layers(net, plan)))
    return net.eval(), arch


def fp8_plan(model: str, quantization: Optional[str], quantize_lm_head: bool = False) -> Optional["Fp8Plan"]:
    """The FP8 plan of `model` (its quantization_config) and the `quantization` and
    `quantize_lm_head` options; None: plain."""
    from tritongen.models.fp8_checkpoint import plan_for

    return plan_for(hf_config_dict(model), quantization, quantize_lm_head)


def build_empty_model(arch: ModelArch, dtype: torch.dtype, device: torch.device,
                      restructure: Optional[Callable[[nn.Module], None]] = None,
                      fp8: Optional["Fp8Plan"] = None) -> CausalLM:
    """The model (with `restructure`, a ModelSplit's, its part) with uninitialized parameters
    allocated on `device` in `dtype` (the `fp8` plan's linear layers as empty Fp8Linear ones);
    buffers are valid."""
    cls = get_model_class(arch.architecture)
    with torch.device("meta"):
        net = cls(arch)
        if restructure is not None:
            restructure(net)
    net = net.to(dtype=dtype)
    if fp8 is not None:
        from tritongen.models.fp8_checkpoint import make_fp8_layers

        make_fp8_layers(net, fp8)
    net = net.to_empty(device=device)
    net.tie_weights()  # to_empty gives each module its own new tensor
    net.reset_buffers()  # meta buffers have no values; inv_freq must be float32
    return net


def full_shapes(arch: ModelArch) -> dict[str, torch.Size]:
    """Name -> shape of every parameter of the unsharded model, in its parameter order."""
    with torch.device("meta"):
        net = get_model_class(arch.architecture)(arch)
    return {name: p.shape for name, p in net.named_parameters()}


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int, spec: Optional[SpecFn] = None,
                       shapes: Optional[dict[str, torch.Size]] = None) -> None:
    """Random weights that give O(1) activations at any size, deterministic in seed (per device type).

    Matrices ~ N(0, 1/fan_in) (for 7B shapes that is the usual ~0.02), norms ~ N(1, 0.1) so that a
    dropped norm weight changes the output (every 1-D weight is a norm's scale), biases ~ N(0, 0.1).
    A sharded model passes the full `shapes` and its `spec`: each full tensor is drawn in turn and
    the rank keeps its slice.
    """
    params = dict(model.named_parameters())  # tied weights appear once
    device = next(iter(params.values())).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, shape in (shapes or {n: p.shape for n, p in params.items()}).items():
        p = params[name]
        s = spec(name) if spec is not None else None
        full = p if s is None else torch.empty(shape, dtype=p.dtype, device=device)
        if name.endswith(".weight") and full.dim() == 1:  # a norm's scale (RMSNorm, LayerNorm)
            full.normal_(1.0, 0.1, generator=gen)
        elif name.endswith(".bias"):
            full.normal_(0.0, 0.1, generator=gen)
        else:
            full.normal_(0.0, full.shape[-1] ** -0.5, generator=gen)
        if s is not None:
            p.copy_(s.take(full))


def _model_dir(model: str) -> Path:
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model path {model!r} does not exist; pass an HF model directory (config.json + weights) "
            f"or dummy:<preset> with one of: {', '.join(PRESETS)}"
        )
    if not path.is_dir():
        raise ValueError(f"model path {model!r} is not a directory (expected an HF model directory)")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model directory {str(path)!r} has no config.json")
    return path


def weight_files(path: Path) -> list[Path]:
    """Checkpoint files of an HF directory: the index's shards if there is an index, else a glob."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = path / index_name
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            missing = [s for s in shards if not (path / s).is_file()]
            if missing:
                raise FileNotFoundError(f"{index} lists shards missing from {str(path)!r}: {missing}")
            return [path / s for s in shards]
    safetensors = sorted(path.glob("*.safetensors"))
    # Mistral repos also ship consolidated.safetensors in Mistral's own naming: prefer HF's files.
    hf_named = [p for p in safetensors if not p.name.startswith("consolidated")]
    if hf_named or safetensors:
        return hf_named or safetensors
    bins = sorted(path.glob("pytorch_model*.bin"))
    if bins:
        return bins
    raise FileNotFoundError(
        f"no weights in model directory {str(path)!r}: expected *.safetensors or pytorch_model*.bin "
        "(use dummy:<preset> for random weights)"
    )


def _iter_tensors(file: Path) -> Iterator[tuple[str, Any]]:
    """(name, tensor) pairs of one file; safetensors yields lazy slices, read when indexed."""
    if file.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_slice(name)
        return
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # legacy (non-zip) torch.save format cannot be memory-mapped
        state = torch.load(file, map_location="cpu", weights_only=True)
    yield from state.items()


def _fp8_tensor(name: str, tensor: Any, plan: "Fp8Plan", params: dict) -> tuple[str, Any]:
    from tritongen.models.fp8_checkpoint import checkpoint_name, checkpoint_scale

    ours = checkpoint_name(name, plan)
    weight = params.get(ours[: -len("_scale")]) if ours.endswith(".weight_scale") else None
    if weight is None:
        return ours, tensor
    return ours, checkpoint_scale(_read(tensor, None), plan, *weight.shape)


def _read(tensor: Any, spec: Optional[TensorSlice]) -> torch.Tensor:
    if spec is not None:
        return spec.take(tensor)
    return tensor if isinstance(tensor, torch.Tensor) else tensor[:]


@torch.no_grad()
def load_checkpoint(model: CausalLM, path: Path, spec: Optional[SpecFn] = None,
                    fp8: Optional["Fp8Plan"] = None) -> None:
    """Copy every parameter (the rank's slice of it, per `spec`) from the checkpoint in `path`;
    the model maps checkpoint names and layouts to its parameters (CausalLM.checkpoint_tensors).
    An `fp8` checkpoint's weight scales are renamed and reshaped to our layout.
    ValueError on missing or mis-shaped ones."""
    params = dict(model.named_parameters(remove_duplicate=False))  # tied lm_head may be in the file
    loaded: set[int] = set()
    unexpected: list[str] = []
    for file in weight_files(path):
        for file_name, lazy in _iter_tensors(file):
            if file_name.endswith(_IGNORED_SUFFIXES):
                continue
            if fp8 is not None:
                file_name, lazy = _fp8_tensor(file_name, lazy, fp8, params)
            for name, value in model.checkpoint_tensors(file_name, lazy):
                param = params.get(name)
                if param is None:
                    unexpected.append(file_name)
                    continue
                tensor = _read(value, spec(name) if spec is not None else None)
                if tensor.dtype in _FP8_DTYPES and param.dtype not in _FP8_DTYPES:
                    raise ValueError(f"{file_name} is stored in {tensor.dtype} but the model keeps {name} in"
                                     f" {param.dtype}: the checkpoint's quantization_config leaves it out"
                                     " (or lacks one), and its scales would be lost")
                if param.shape != tensor.shape:
                    raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(param.shape)}")
                param.copy_(tensor)
                loaded.add(id(param))
    missing = [name for name, p in params.items() if id(p) not in loaded]
    if missing:
        raise ValueError(
            f"checkpoint in {str(path)!r} lacks {len(missing)} parameters, e.g. {missing[:5]}"
            + (f"; it has unexpected ones, e.g. {unexpected[:5]}" if unexpected else "")
        )
    if unexpected:
        logger.warning("ignored %d unexpected checkpoint tensors, e.g. %s", len(unexpected), unexpected[:5])
