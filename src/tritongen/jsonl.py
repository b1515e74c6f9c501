"""Line reading for JSONL and one-item-per-line files.

str.splitlines() also breaks at U+2028, U+2029, U+0085 and other separators, which JSON strings may
hold unescaped; these files break only at LF (CRLF and CR endings are read too).
"""
from __future__ import annotations

from pathlib import Path


def read_lines(path: str | Path) -> list[str]:
    with open(Path(path).expanduser(), encoding="utf-8", newline=None) as f:  # universal newlines: \n \r \r\n
        return [line.rstrip("\n") for line in f]
