"""The control channel from our forwarding models (llm_bls, the ensemble's token step) to the
engine model, which clients must not be able to use.

python_backend 24.10 cannot cancel a BLS request, so a forwarding model whose client left names
its inner request in a control request (input abort_request_id). Every input a forwarding model
can send, a client can send too, so a control request also carries a secret: the engine model
makes a random token when it loads and writes it into a file that only this user can read,
named after the server process (the parent of every stub of one tritonserver). A client can
neither read that file nor guess the token; a control request without it is INVALID_ARG.
"""
from __future__ import annotations

import hmac
import os
import secrets
import tempfile
from pathlib import Path
from typing import Optional

CANCEL_POLL_S = 0.2
"""How often the engine model and the forwarding models ask each request's response sender whether its
client cancelled (the contract: aborted within 0.5 s). Each check is a round trip to the server, so
both spread the checks over the interval, never one burst per request."""

TOKEN_PARAMETER = "tritongen_control_token"
"""Request parameter that carries the token on a control request."""

DRAIN_FILE_ENV = "TRITONGEN_DRAIN_FILE"
"""Set by `tritongen serve` in tritonserver's environment (the stubs inherit it): a path the
launcher creates just before it asks the server to stop. Triton never tells a model that the
server is stopping (finalize runs only after every in-flight request has ended), so the engine
model reads this once at load and watches the file: when it appears, in-flight requests end with
UNAVAILABLE at once and metric updates stop (each is a round trip to a server that is going)."""


def token_path(model_name: str, server_pid: Optional[int] = None) -> Path:
    """Where the engine model `model_name` of the server `server_pid` (default: our parent)
    keeps its token."""
    pid = os.getppid() if server_pid is None else server_pid
    return Path(tempfile.gettempdir()) / f"tritongen-{os.getuid()}" / f"{pid}-{model_name}.token"


def publish_token(model_name: str) -> str:
    """Engine model side, at load: a new token, written with this stub's pid (forwarding models
    watch that process: when it dies their requests to it end at once)."""
    path = token_path(model_name)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path.parent, 0o700)
    token = secrets.token_hex(32)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{token}\n{os.getpid()}\n")
    os.replace(partial, path)  # readers never see half a file
    return token


def _read(model_name: str, server_pid: Optional[int] = None) -> list[str]:
    try:
        return token_path(model_name, server_pid).read_text().split()
    except OSError:
        return []


def read_token(model_name: str) -> Optional[str]:
    """Forwarding model side: the token of the engine model `model_name`, None if it has none yet."""
    parts = _read(model_name)
    return parts[0] if parts else None


def engine_pid(model_name: str, server_pid: Optional[int] = None) -> Optional[int]:
    """The pid of the stub that hosts the engine model `model_name` of the server `server_pid`
    (default: our parent), None if it has not loaded."""
    parts = _read(model_name, server_pid)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def process_state(pid: int) -> Optional[str]:
    """The state letter of /proc/<pid>/stat (R, S, Z, ...), None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]  # the name in parentheses may hold spaces
    except (OSError, IndexError):
        return None


def process_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, dead but not yet reaped by the server, counts as gone)."""
    return process_state(pid) not in (None, "Z", "X")


def remove_token(model_name: str) -> None:
    """At unload: remove the file if it is still this stub's (a newer load may have replaced it)."""
    if engine_pid(model_name) != os.getpid():
        return
    try:
        token_path(model_name).unlink()
    except OSError:
        pass


def is_valid(given: object, token: str) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given.encode(), token.encode())
