"""Request bodies as JSON values, refused with a 400 naming the problem before any schema sees them.

json.loads accepts two things that later code cannot take: lone UTF-16 surrogates written as
escapes ("\\ud800" decodes to a str that no tokenizer, encoder or pydantic serializer accepts), and
nesting deep enough to exhaust the recursion limit (in json itself, or in pydantic and our code
after it). Both are client errors, so both are 400s here.
"""
from __future__ import annotations

import json
import re
from typing import Any, Optional

from tritongen.openai.serving import RequestError

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects accepted. The deepest body we serve is a tool or
response_format JSON schema; 64 levels is far beyond any real one and far below recursion limits."""

# A surrogate can only reach a str through a \\uXXXX escape: raw bytes that encode one are
# invalid UTF-8 and already fail json.loads. So the walk below runs only when the raw text has
# such an escape, and bodies without one (nearly all) cost one regex scan.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def parse_json(raw: bytes) -> Any:
    """The JSON value of a request body; raises RequestError (400) for anything we cannot take."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise RequestError(f"the JSON body is nested too deeply (more than {MAX_DEPTH} levels)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"malformed JSON body: {exc}") from None
    _check_tree(body, bool(_SURROGATE_ESCAPE.search(raw)))
    return body


def _check_tree(body: Any, may_have_surrogates: bool) -> None:
    """Depth bound everywhere; with `may_have_surrogates`, every string and key checked too.
    Iterative, so that the check itself cannot overflow the stack it protects."""
    stack: list[tuple[Any, int, str]] = [(body, 1, "")] if isinstance(body, (dict, list)) else []
    while stack:
        value, depth, path = stack.pop()
        if depth > MAX_DEPTH:
            raise RequestError(f"{path or 'the JSON body'}: nested too deeply (more than {MAX_DEPTH} levels)",
                               _top(path))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, child in items:
            if may_have_surrogates and isinstance(key, str):
                _check_text(key, path or "the JSON body")
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1, _join(path, key)))
            elif may_have_surrogates and isinstance(child, str):
                _check_text(child, _join(path, key))


def _check_text(text: str, path: str) -> None:
    if not text.isascii() and _SURROGATE.search(text):
        raise RequestError(f"{path}: the string holds a lone UTF-16 surrogate (\\ud800-\\udfff), "
                           "which is not valid Unicode", _top(path))


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _top(path: str) -> Optional[str]:
    """The top-level field of a path such as messages[0].content: OpenAI's `param`."""
    if not path:
        return None
    return re.split(r"[.\[]", path, maxsplit=1)[0]
