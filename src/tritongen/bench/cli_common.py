"""Flags and helpers shared by the bench commands."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional


def add_dataset_args(p: argparse.ArgumentParser, engine: bool = False) -> None:
    """Dataset flags; with engine=True the engine's own --seed and --tokenizer serve (no duplicates)."""
    d = p.add_argument_group("dataset")
    d.add_argument("--dataset", default="sharegpt-like",
                   help="sharegpt-like | sharegpt:PATH | random:IN:OUT | file:PATH.jsonl (docs/bench.md)")
    d.add_argument("--num-prompts", type=int, default=1000, help="requests in the dataset")
    if not engine:
        d.add_argument("--seed", type=int, default=0, help="dataset seed (also the arrival-time seed)")
    d.add_argument("--corpus", default=None, help="text file to cut prompts from (default: the shipped Shakespeare)")
    if not engine:
        d.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model's, or SmolLM2's)")


def load_bench_tokenizer(args: argparse.Namespace, model: Optional[str] = None):
    from tritongen.fetch import resolve_model
    from tritongen.tokenizer import load_tokenizer

    path = args.tokenizer
    if path is None and model and model.startswith("dummy:"):
        from tritongen.preset_tokenizers import dummy_tokenizer_path

        path = dummy_tokenizer_path(model)  # what the engine serving that preset speaks
    if path is None:
        path = model if model and Path(model).expanduser().is_dir() else resolve_model(None)
    return load_tokenizer(path)


def write_json(path: Optional[str], data: dict) -> None:
    if path:
        Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        Path(path).expanduser().write_text(json.dumps(data, indent=2))
        print(f"wrote {path}", file=sys.stderr)
