#!/usr/bin/env python3
"""tritongen's OpenAI-compatible server through the official `openai` SDK (pip install openai).

    python clients/python/openai_client.py --base-url http://127.0.0.1:9000/v1 --prompt "Hello"

Prints one completion, then streams a chat answer token by token, then the usage. A completion
continues its prompt as raw text (no chat template), so it gets a prompt to continue; the chat
answers the question.
"""
from __future__ import annotations

import argparse
import sys

try:
    from openai import OpenAI
except ImportError:  # one line, not a traceback
    sys.exit("the openai package is missing: pip install openai (or tritongen's extra: pip install -e '.[clients]')")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:9000/v1")
    p.add_argument("--api-key", default="none", help="the server's --api-key, if it has one")
    p.add_argument("--model", default=None, help="default: the first model the server lists")
    p.add_argument("--prompt", default="What is the capital of France?", help="the chat question")
    p.add_argument("--completion-prompt", default="The capital of France is", help="the text the completion continues")
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args(argv)

    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = args.model or client.models.list().data[0].id

    completion = client.completions.create(model=model, prompt=args.completion_prompt, max_tokens=args.max_tokens,
                                           temperature=0)
    print(f"completion: {completion.choices[0].text!r} (finish_reason={completion.choices[0].finish_reason})")

    print("chat stream: ", end="", flush=True)
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": args.prompt}], max_tokens=args.max_tokens,
        temperature=0, stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
        if chunk.usage is not None:
            print(f"\nusage: prompt_tokens={chunk.usage.prompt_tokens} "
                  f"completion_tokens={chunk.usage.completion_tokens}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
