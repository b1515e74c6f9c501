"""`tritongen eval parity | task` (registered by tritongen.cli)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _write_json(path, data: dict) -> None:
    if path:
        Path(path).expanduser().write_text(json.dumps(data, indent=2))
        print(f"wrote {path}", file=sys.stderr)


def cmd_parity(args: argparse.Namespace) -> int:
    from tritongen.eval.parity import format_parity, load_prompts, run_parity

    prompts = load_prompts(args.prompts)[: args.limit or None]
    summary = run_parity(args.model, prompts, args.max_tokens, args.chat, against=args.against, dtype=args.dtype,
                         device=args.device, seed=args.seed, enable_prefix_caching=False,
                         tensor_parallel_size=args.tensor_parallel_size, quantization=args.quantization,
                         quantize_lm_head=args.quantize_lm_head)
    print(format_parity(summary))
    if args.show:
        for i, row in enumerate(summary["per_prompt"]):
            print(f"[{i}] ours: {row['ours']!r}\n    hf:   {row['hf']!r}")
    _write_json(args.out, summary)
    return 0 if summary["token_match"] == 100.0 else 1


def _backend(args: argparse.Namespace):
    from tritongen.eval.backends import EngineBackend, OpenAIBackend

    if args.target == "engine":
        from tritongen import LLM
        from tritongen.config_cli import engine_kwargs

        return EngineBackend(LLM(**engine_kwargs(args)))
    from tritongen.fetch import resolve_model
    from tritongen.tokenizer import load_tokenizer

    url = args.url or "http://127.0.0.1:9000"
    tokenizer = load_tokenizer(args.tokenizer or resolve_model(None))
    return OpenAIBackend(url, tokenizer, model=args.served_model, api_key=args.api_key)


def cmd_task(args: argparse.Namespace) -> int:
    from tritongen.eval.task_runner import format_task, run_task
    from tritongen.eval.tasks import load_task

    items = load_task(args.task, args.limit, args.task_seed, args.corpus)
    backend = _backend(args)
    try:
        result = run_task(backend, items)
    finally:
        if hasattr(backend, "close"):
            backend.close()
    print(format_task(result["summary"], args.task))
    _write_json(args.out, result)
    return 0


def register(subparsers) -> None:
    from tritongen.config_cli import add_engine_args

    ev = subparsers.add_parser("eval", help="accuracy: parity with HF transformers, task accuracy")
    sub = ev.add_subparsers(dest="eval_command", required=True)

    p = sub.add_parser("parity", help="our engine vs HF transformers on the same weights (greedy)")
    p.add_argument("--model", default=None, help="HF directory or dummy:<preset> (default: SmolLM2-135M)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0, help="seed of dummy weights")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="split our engine over N ranks")
    p.add_argument("--quantization", default=None, help="fp8: our engine quantizes the linear layers at load")
    p.add_argument("--quantize-lm-head", action="store_true", help="with --quantization fp8: lm_head too")
    p.add_argument("--against", choices=["hf", "bf16"], default="hf",
                   help="hf: HF transformers on the same weights; bf16: our engine unquantized (same --dtype)")
    p.add_argument("--prompts", default="builtin", help="builtin | FILE.txt (one per line) | FILE.jsonl")
    p.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                   help="wrap prompts in the tokenizer's chat template when it has one")
    p.add_argument("--show", action="store_true", help="print both texts of every prompt")
    p.add_argument("--out", default=None, help="write the report as JSON")
    p.set_defaults(func=cmd_parity)

    t = sub.add_parser("task", help="accuracy on a task (generation: exact match; multiple choice: loglikelihood)")
    t.add_argument("--target", choices=["engine", "openai"], default="engine")
    t.add_argument("--url", default=None, help="OpenAI server base URL (target openai), e.g. http://127.0.0.1:9000")
    t.add_argument("--served-model", default=None, help="'model' to send (default: the server's first model)")
    t.add_argument("--api-key", default=None)
    t.add_argument("--task", default="builtin", help="builtin | builtin:lastword | builtin:lastword-mc | FILE.jsonl")
    t.add_argument("--limit", type=int, default=None, help="at most N items (built-in tasks: default 100)")
    t.add_argument("--task-seed", type=int, default=0, help="which items the built-in tasks pick")
    t.add_argument("--corpus", default=None, help="text file for the built-in tasks (default: shipped Shakespeare)")
    t.add_argument("--out", default=None, help="write the summary and per-item results as JSON")
    add_engine_args(t)  # for --target engine (its --tokenizer also serves --target openai)
    t.set_defaults(func=cmd_task)
