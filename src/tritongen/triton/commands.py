"""`tritongen repo`: write a Triton model repository (registered by cli.py)."""
from __future__ import annotations

import argparse


def register(subparsers) -> None:
    from tritongen.cli import add_engine_args

    p = subparsers.add_parser("repo", help="write a Triton model repository for a model")
    p.add_argument("--out", required=True, help="repository directory (created; our model folders are replaced)")
    p.add_argument("--layout", choices=["default", "ensemble"], default="default",
                   help="default: llm + llm_bls; ensemble: also preprocessing -> llm -> postprocessing")
    p.add_argument("--name", default="llm", help="name of the decoupled engine model (the BLS front is <name>_bls)")
    p.add_argument("--version", type=int, default=1, help="version folder to write")
    add_engine_args(p)
    p.set_defaults(func=cmd_repo)


def cmd_repo(args: argparse.Namespace) -> int:
    from tritongen.cli import engine_kwargs
    from tritongen.triton.repo import write_repository

    root = write_repository(args.out, engine_kwargs(args), layout=args.layout, name=args.name, version=args.version)
    models = sorted(p.name for p in root.iterdir() if (p / "config.pbtxt").is_file())
    print(f"wrote {root}: {', '.join(models)}")
    return 0
