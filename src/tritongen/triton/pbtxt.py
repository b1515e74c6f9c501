"""config.pbtxt text and model folders: what every model of the repository is written with
(repo.py and ensemble_models.py both build on it; it imports neither)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Collection, Iterable, Optional, Union

from tritongen.triton import layouts
from tritongen.triton.codec import INPUTS, OUTPUTS, TensorSpec

_MODEL_PY = '''"""Triton Python-backend model written by `tritongen repo`; the logic lives in {module}."""
import faulthandler

from {module} import {cls} as _Model

# A stub killed by a fatal signal while it serves leaves its Python stacks in the server log: every
# thread's, or only the faulting one's where the model runs more threads than faulthandler lists (100).
faulthandler.enable(all_threads=getattr(_Model, "FAULT_ALL_THREADS", True))


class TritonPythonModel(_Model):
    def finalize(self) -> None:
        try:
            getattr(super(), "finalize", lambda: None)()
        finally:  # teardown after an unload can fault freeing pb_utils metrics (shm already gone): not ours to report
            faulthandler.disable()
'''


def quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def tensors(kind: str, specs: Iterable[TensorSpec], optional: Union[bool, Collection[str]]) -> str:
    """An `input [...]` / `output [...]` block; `optional`: all, none, or the names of the optional ones."""
    rows = []
    for s in specs:
        opt = " optional: true" if (optional is True or (optional and s.name in optional)) else ""
        rows.append(f'  {{ name: {quote(s.name)} data_type: {s.data_type} dims: [ {", ".join(map(str, s.dims))} ]{opt} }}')
    return f"{kind} [\n" + ",\n".join(rows) + "\n]\n"


def parameter_lines(params: dict[str, str]) -> str:
    return "".join(f"parameters: {{ key: {quote(k)} value: {{ string_value: {quote(v)} }} }}\n"
                   for k, v in sorted(params.items()))


def parameter_values(text: str, key: str) -> list[str]:
    """The values of parameter `key` in config.pbtxt text as parameter_lines writes it."""
    value = r'"(?:[^"\\]|\\.)*"'  # a JSON string, as quote() writes it
    pattern = f"parameters: {{ key: {re.escape(quote(key))} value: {{ string_value: ({value}) }} }}"
    return [json.loads(m) for m in re.findall(pattern, text)]


def version_policy(policy: Optional[str]) -> str:
    """`latest:N` | `all` | `specific:1,3` -> the config.pbtxt `version_policy` line ("" for None:
    Triton's default, the latest version). Raises ValueError naming the bad part."""
    if policy is None:
        return ""
    policy = policy.strip()
    if policy == "all":
        return "version_policy: { all { } }\n"
    m = re.fullmatch(r"latest:(\d+)", policy)
    if m and int(m.group(1)) >= 1:
        return f"version_policy: {{ latest {{ num_versions: {int(m.group(1))} }} }}\n"
    m = re.fullmatch(r"specific:(\d+(?:,\d+)*)", policy)
    if m and all(int(v) >= 1 for v in m.group(1).split(",")):
        versions = ", ".join(str(int(v)) for v in m.group(1).split(","))
        return f"version_policy: {{ specific {{ versions: [ {versions} ] }} }}\n"
    raise ValueError(f"version policy must be latest:N (N >= 1), all, or specific:V[,V...] (versions >= 1), "
                     f"got {policy!r}")


def model_config(name: str, *, decoupled: bool, instance_kind: str, parameters: dict[str, str],
                 inputs: Iterable[TensorSpec] = INPUTS, outputs: Iterable[TensorSpec] = OUTPUTS,
                 max_batch_size: int = 0, optional_inputs: Union[bool, Collection[str]] = True,
                 policy: Optional[str] = None) -> str:
    text = f"name: {quote(name)}\nbackend: \"python\"\nmax_batch_size: {max_batch_size}\n"
    if decoupled:
        text += "model_transaction_policy { decoupled: true }\n"
    text += version_policy(policy)
    text += tensors("input", inputs, optional_inputs) + tensors("output", outputs, False)
    text += f"instance_group [ {{ count: 1 kind: {instance_kind} }} ]\n"
    return text + parameter_lines(parameters)


def write_model(root: Path, name: str, config: str, module: Optional[str], version: int,
                cls: str = "TritonPythonModel") -> None:
    """config.pbtxt plus <version>/model.py importing `cls` from `module` (an ensemble has none)."""
    model_dir = root / name
    (model_dir / str(version)).mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config)
    if module is not None:
        (model_dir / str(version) / "model.py").write_text(_MODEL_PY.format(module=module, cls=cls))


def write_forwarder(root: Path, model: str, target: str, layout: str, *, decoupled: bool, version: int,
                    policy: Optional[str], all_outputs: bool = False, text: bool = False) -> None:
    """A forwarding model (bls_model.py) of `layout` in front of the engine model `target`; `text`:
    TensorRT-LLM's text outputs (tensorrt_llm_bls) instead of its token outputs."""
    params = {"llm_model": target, "layout": layout}
    if all_outputs:
        params["all_outputs"] = "true"
    if layout == "vllm":
        inputs, outputs, batch = layouts.inputs_for(layout), None, 0
    elif layout == "fastertransformer":
        inputs, outputs, batch = layouts.FT_INPUTS, layouts.FT_OUTPUTS, layouts.MAX_BATCH_SIZE
    else:
        inputs = layouts.inputs_for(layout)
        outputs = layouts.TRTLLM_TEXT_OUTPUTS if text else layouts.TRTLLM_TOKEN_OUTPUTS
        batch = layouts.MAX_BATCH_SIZE
    kwargs = {"outputs": outputs} if outputs is not None else {}
    write_model(root, model, model_config(model, decoupled=decoupled, instance_kind="KIND_CPU", parameters=params,
                                          inputs=inputs, max_batch_size=batch, policy=policy, **kwargs),
                "tritongen.triton.bls_model", version)
