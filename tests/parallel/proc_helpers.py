"""Process and polling checks shared by tests in several directories (every tests subdirectory
is on sys.path, so this imports by name)."""
from __future__ import annotations

import time
from typing import Callable


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (its name may hold ") ", hence rsplit)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
