"""Write a Triton model repository: config.pbtxt files (engine options as `parameters`), version
folders, and thin model.py files that import tritongen and delegate to it.

Layouts:
- default: `llm` (decoupled, hosts the engine) and `llm_bls` (non-decoupled front, forwards to it).
- ensemble: the default models plus TensorRT-LLM-style `preprocessing` -> `<name>_tokens` ->
  `postprocessing` wired as `ensemble` (see triton/ensemble_models.py).
"""
from __future__ import annotations

import json
import shutil
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Collection, Iterable, Optional, Union

from tritongen.config import ENGINE_CONFIG_PARTS
from tritongen.triton.codec import INPUTS, OUTPUTS, TensorSpec

_ENGINE_CONFIGS = tuple(cls for _, cls in ENGINE_CONFIG_PARTS)

_MODEL_PY = '''"""Triton Python-backend model written by `tritongen repo`; the logic lives in {module}."""
from {module} import {cls}  # noqa: F401
'''


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


# -- config.pbtxt -----------------------------------------------------------------------------


def _q(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _tensors(kind: str, specs: Iterable[TensorSpec], optional: Union[bool, Collection[str]]) -> str:
    """`optional`: all, none, or the names of the optional ones."""
    rows = []
    for s in specs:
        opt = " optional: true" if (optional is True or (optional and s.name in optional)) else ""
        rows.append(f'  {{ name: {_q(s.name)} data_type: {s.data_type} dims: [ {", ".join(map(str, s.dims))} ]{opt} }}')
    return f"{kind} [\n" + ",\n".join(rows) + "\n]\n"


def _parameters(params: dict[str, str]) -> str:
    return "".join(f"parameters: {{ key: {_q(k)} value: {{ string_value: {_q(v)} }} }}\n"
                   for k, v in sorted(params.items()))


def model_config(name: str, *, decoupled: bool, instance_kind: str, parameters: dict[str, str],
                 inputs: Iterable[TensorSpec] = INPUTS, outputs: Iterable[TensorSpec] = OUTPUTS,
                 max_batch_size: int = 0, optional_inputs: Union[bool, Collection[str]] = True) -> str:
    text = f"name: {_q(name)}\nbackend: \"python\"\nmax_batch_size: {max_batch_size}\n"
    if decoupled:
        text += "model_transaction_policy { decoupled: true }\n"
    text += _tensors("input", inputs, optional_inputs) + _tensors("output", outputs, False)
    text += f"instance_group [ {{ count: 1 kind: {instance_kind} }} ]\n"
    return text + _parameters(parameters)


def write_model(root: Path, name: str, config: str, module: Optional[str], version: int,
                cls: str = "TritonPythonModel") -> None:
    """config.pbtxt plus <version>/model.py importing `cls` from `module` (an ensemble has none)."""
    model_dir = root / name
    (model_dir / str(version)).mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config)
    if module is not None:
        imported = cls if cls == "TritonPythonModel" else f"{cls} as TritonPythonModel"
        (model_dir / str(version) / "model.py").write_text(_MODEL_PY.format(module=module, cls=imported))


def write_repository(out: str | Path, options: Optional[dict] = None, *, layout: str = "default",
                     name: str = "llm", version: int = 1, overwrite: bool = True,
                     max_queue: Optional[int] = None) -> Path:
    """Write the model repository for `options` (engine keyword options) into `out`. `max_queue`:
    the engine model's `max_queue` parameter (requests let wait beyond max_num_seqs; 0 = unbounded;
    None leaves the model's default)."""
    if max_queue is not None and (isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 0):
        raise ValueError(f"max_queue must be a non-negative integer, got {max_queue!r}")
    if layout not in ("default", "ensemble"):
        raise ValueError(f"layout must be 'default' or 'ensemble', got {layout!r}")
    if not name or "/" in name:
        raise ValueError(f"bad model name {name!r}")
    root = Path(out)
    for model in _model_names(layout, name):  # other versions of our models stay
        if (root / model / str(version)).exists():
            if not overwrite:
                raise FileExistsError(f"{root / model / str(version)} exists")
            shutil.rmtree(root / model / str(version))
    root.mkdir(parents=True, exist_ok=True)
    params = engine_parameters(options or {})
    llm_params = params if max_queue is None else {**params, "max_queue": str(max_queue)}
    write_model(root, name, model_config(name, decoupled=True, instance_kind="KIND_MODEL", parameters=llm_params),
                "tritongen.triton.llm_model", version)
    write_model(root, f"{name}_bls", model_config(f"{name}_bls", decoupled=False, instance_kind="KIND_CPU",
                                                  parameters={"llm_model": name}),
                "tritongen.triton.bls_model", version)
    if layout == "ensemble":
        from tritongen.triton.ensemble_models import write_ensemble

        write_ensemble(root, name, params, version)
    return root


def _model_names(layout: str, name: str) -> list[str]:
    names = [name, f"{name}_bls"]
    if layout == "ensemble":
        from tritongen.triton.ensemble_models import model_names

        names += model_names(name)
    return names
