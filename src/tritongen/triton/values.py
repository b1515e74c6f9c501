"""Client values -> Python values, bounded: what Triton inputs and the JSON objects inside them
may hold. Every failure is an InvalidInput whose message names the input and shows at most a
short piece of the value, whatever the client sent (deep, huge, or not text at all).
"""
from __future__ import annotations

import json
import math
from typing import Any, Optional

import numpy as np


class InvalidInput(ValueError):
    """A request input is missing, ill-typed or out of range; the message names the input."""


def convert(value: Any, kind: type, name: str) -> Any:
    """One numpy / JSON value -> int | float | bool | str, or InvalidInput naming `name`."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bytes):
        value = decode(value, name)
    try:
        if kind is bool:
            if isinstance(value, str) and value.strip().lower() in ("true", "1", "false", "0"):
                return value.strip().lower() in ("true", "1")
            if isinstance(value, (bool, int)) and value in (0, 1):
                return bool(value)
            raise ValueError
        if kind is int:
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            result = int(value.strip()) if isinstance(value, str) else int(value)
            if _INT_MIN <= result <= _INT_MAX:
                return result
            raise ValueError
        if kind is float:
            if isinstance(value, bool):
                raise ValueError
            result = float(value)
            if not math.isfinite(result):
                raise ValueError
            return result
        if kind is str:
            if not isinstance(value, str):
                raise ValueError
            return value
    except (TypeError, ValueError, OverflowError):
        pass
    raise InvalidInput(f"input '{name}' must be {KIND_NAMES[kind]}, got {short(value)}")


KIND_NAMES = {bool: "a boolean", int: "an integer in [-2**63, 2**64 - 1]", float: "a finite number",
               str: "a string"}
TENSOR_KINDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what an INT64 or UINT64 tensor can hold


def decode(raw: bytes, name: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"input '{name}' is not valid UTF-8: {exc}") from None


MAX_JSON_CHARS = 65536
"""Longest sampling_parameters / request parameters text: the largest legitimate one (stop strings
included) is a few kilobytes, and json.loads of megabytes would hold the request's thread."""
MAX_JSON_DEPTH = 8
"""Deepest nesting accepted in those JSON objects (the vllm layout needs 2: an object of lists)."""


def json_object(raw: Optional[str], name: str) -> dict:
    if raw is None or not raw.strip():
        return {}
    if len(raw) > MAX_JSON_CHARS:
        raise InvalidInput(f"input '{name}' is {len(raw)} characters long; at most {MAX_JSON_CHARS} are accepted")
    if json_depth(raw) > MAX_JSON_DEPTH:
        raise InvalidInput(f"input '{name}' nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"input '{name}' is not valid JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits
        raise InvalidInput(f"input '{name}' holds a value that cannot be read: {short(str(exc), plain=True)}") from None
    if not isinstance(obj, dict):
        raise InvalidInput(f"input '{name}' must be a JSON object, got {type(obj).__name__}")
    return obj


def json_depth(raw: str) -> int:
    """Deepest bracket nesting of a JSON text, brackets inside strings skipped; linear time,
    no recursion (json.loads itself recurses once per level)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in raw:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def short(value: Any, limit: int = 80, plain: bool = False) -> str:
    """repr of a client's value (the string itself when `plain`) for an error message, cut to
    `limit` characters: a message must stay readable whatever the client sent."""
    try:
        text = value if plain and isinstance(value, str) else repr(value)
    except (RecursionError, ValueError):
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def json_list(value: Any, kind: type, name: str) -> list:
    if isinstance(value, str):
        stripped = value.strip()
        if kind is int or stripped.startswith("["):
            try:
                value = json.loads(stripped)
            except json.JSONDecodeError:
                raise InvalidInput(f"'{name}' must be a list, got {short(value)}") from None
        else:
            value = [value]  # a single stop string
    if not isinstance(value, list):
        value = [value]
    return [convert(v, kind, name) for v in value]
