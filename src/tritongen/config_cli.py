"""The engine's configs as command-line flags: one flag per field of every EngineConfig part
(--max-num-seqs, --block-size, ...), its docstring as the help. Every front's command (serve, repo,
bench, eval) takes them from here. Pure Python (argparse)."""
from __future__ import annotations

import argparse
import ast
import inspect
from dataclasses import MISSING, fields

from tritongen.config import ENGINE_CONFIG_PARTS


def field_docs(cls) -> dict[str, str]:
    """The docstring under each dataclass field (they double as CLI help)."""
    docs: dict[str, str] = {}
    body = ast.parse(inspect.getsource(cls)).body[0].body
    for prev, node in zip(body, body[1:]):
        if isinstance(prev, ast.AnnAssign) and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            docs[prev.target.id] = str(node.value.value)
    return docs


def field_kind(f) -> type:
    """int | float | str | bool for a config field (Optional[...] unwrapped)."""
    return {"int": int, "float": float, "str": str, "bool": bool}.get(
        str(f.type).replace("Optional[", "").rstrip("]"), str)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """One flag per engine config field: --max-num-seqs, --block-size, ... (booleans also --no-...)."""
    for _, cls in ENGINE_CONFIG_PARTS:
        docs = field_docs(cls)
        for f in fields(cls):
            flag = "--" + f.name.replace("_", "-")
            default = f.default if f.default is not MISSING else None
            kind = field_kind(f)
            if kind is bool:
                p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=docs.get(f.name))
            else:
                p.add_argument(flag, type=kind, default=default, help=docs.get(f.name))


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The engine options of parsed arguments (what add_engine_args added), as LLM(**...) takes them."""
    names = [f.name for _, cls in ENGINE_CONFIG_PARTS for f in fields(cls)]
    return {n: getattr(args, n) for n in names}
