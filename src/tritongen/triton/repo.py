"""Write a Triton model repository: config.pbtxt files (engine options as `parameters`), version
folders, and thin model.py files that import tritongen and delegate to it.

Layouts:
- default: `llm` (decoupled, hosts the engine), `llm_bls` (non-decoupled front, forwards to it)
  and `fastertransformer` (non-decoupled, batched, FasterTransformer's tensors; layouts.py).
- ensemble: the default models plus TensorRT-LLM's: `ensemble` = `preprocessing` ->
  `tensorrt_llm` -> `postprocessing`, the streaming token model `<name>_tokens` and
  `tensorrt_llm_bls` (see triton/ensemble_models.py).
"""
from __future__ import annotations

import shutil
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Optional

from tritongen.config import ENGINE_CONFIG_PARTS
from tritongen.triton import ensemble_models
from tritongen.triton.pbtxt import model_config, version_policy, write_forwarder, write_model

_ENGINE_CONFIGS = tuple(cls for _, cls in ENGINE_CONFIG_PARTS)


# -- engine options <-> config.pbtxt parameters -----------------------------------------------


def _field_kinds() -> dict[str, type]:
    kinds = {}
    for cls in _ENGINE_CONFIGS:
        for f in fields(cls):
            text = str(f.type).replace("Optional[", "").rstrip("]")
            kinds[f.name] = {"int": int, "float": float, "bool": bool}.get(text, str)
    return kinds


def engine_parameters(options: dict) -> dict[str, str]:
    """Engine keyword options -> config.pbtxt string parameters (None values are left out)."""
    kinds = _field_kinds()
    unknown = sorted(set(options) - set(kinds))
    if unknown:
        raise ValueError(f"unknown engine options: {unknown}")
    out = {}
    for name, value in options.items():
        if value is None:
            continue
        out[name] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def parameter_value(entry: object) -> str:
    """One config.pbtxt parameter as the model config JSON holds it ({"string_value": "..."}), or a plain value."""
    return entry.get("string_value", "") if isinstance(entry, dict) else str(entry)


def engine_kwargs_from_config(parameters: dict) -> dict:
    """config.pbtxt parameters ({"key": {"string_value": "..."}}) -> engine keyword options.
    Parameters that are not engine options (e.g. llm_model) are ignored."""
    kinds = _field_kinds()
    kwargs = {}
    for name, entry in parameters.items():
        if name not in kinds:
            continue
        raw = parameter_value(entry)
        kind = kinds[name]
        try:
            if kind is bool:
                if raw.lower() not in ("true", "false", "1", "0"):
                    raise ValueError
                kwargs[name] = raw.lower() in ("true", "1")
            else:
                kwargs[name] = kind(raw)
        except ValueError:
            raise ValueError(f"model parameter {name!r} must be {kind.__name__}, got {raw!r}") from None
    return kwargs


def default_options() -> dict:
    return {f.name: f.default for cls in _ENGINE_CONFIGS for f in fields(cls) if f.default is not MISSING}


def write_repository(out: str | Path, options: Optional[dict] = None, *, layout: str = "default",
                     name: str = "llm", version: int = 1, overwrite: bool = True,
                     max_queue: Optional[int] = None, stream_interval: Optional[int] = None,
                     sender_threads: Optional[int] = None, policy: Optional[str] = None) -> Path:
    """Write the model repository for `options` (engine keyword options) into `out`. The engine
    model's parameters `max_queue` (requests let wait beyond max_num_seqs; 0 = unbounded) and
    `stream_interval` (tokens per streamed response) and `sender_threads` (concurrent response
    sends); None leaves the model's default. `policy`:
    every model's version_policy (latest:N, all, specific:1,3; None: Triton's default, the latest)."""
    for label, value, low in (("max_queue", max_queue, 0), ("stream_interval", stream_interval, 1),
                              ("sender_threads", sender_threads, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise ValueError(f"{label} must be an integer >= {low}, got {value!r}")
    if layout not in ("default", "ensemble"):
        raise ValueError(f"layout must be 'default' or 'ensemble', got {layout!r}")
    if not name or "/" in name:
        raise ValueError(f"bad model name {name!r}")
    version_policy(policy)  # a bad policy fails before anything is written
    root = Path(out)
    for model in model_names(layout, name):  # other versions of our models stay
        if (root / model / str(version)).exists():
            if not overwrite:
                raise FileExistsError(f"{root / model / str(version)} exists")
            shutil.rmtree(root / model / str(version))
    root.mkdir(parents=True, exist_ok=True)
    params = engine_parameters(options or {})
    llm_params = dict(params)
    for key, value in (("max_queue", max_queue), ("stream_interval", stream_interval),
                       ("sender_threads", sender_threads)):
        if value is not None:
            llm_params[key] = str(value)
    write_model(root, name, model_config(name, decoupled=True, instance_kind="KIND_MODEL", parameters=llm_params,
                                         policy=policy), "tritongen.triton.llm_model", version)
    write_forwarder(root, f"{name}_bls", name, "vllm", decoupled=False, version=version, policy=policy)
    write_forwarder(root, "fastertransformer", name, "fastertransformer", decoupled=False, version=version,
                    policy=policy)
    if layout == "ensemble":
        ensemble_models.write_ensemble(root, name, params, version, policy)
    return root


def model_names(layout: str, name: str) -> list[str]:
    """Every model `write_repository` writes for `layout`."""
    names = [name, f"{name}_bls", "fastertransformer"]
    if layout == "ensemble":
        names += ensemble_models.model_names(name)
    return names
