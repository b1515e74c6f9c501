"""Child interpreters of the engine (the engine process, tensor-parallel workers): started as
`python -m <module> <fd>` with an inherited descriptor, never forked (CUDA and the engine's threads
do not survive a fork) and not through multiprocessing's spawn (which re-imports the caller's
__main__), so they start the same way from a script, a test or Triton's Python-backend stub."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path


def python_executable() -> str:
    """The interpreter for worker processes. Inside Triton's stub sys.executable is not Python."""
    for candidate in (sys.executable, getattr(sys, "_base_executable", ""), shutil.which("python3") or ""):
        if candidate and os.path.basename(candidate).startswith("python") and os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError("no Python interpreter found for tensor parallel workers (set PATH to include python3)")


def spawn_module(module: str, fd: int) -> subprocess.Popen:
    """`python -m <module> <fd>` with this tritongen importable and `fd` inherited: how the
    tensor-parallel workers and the engine process start (no fork, no multiprocessing spawn)."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1])  # the directory that holds tritongen
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return subprocess.Popen([python_executable(), "-m", module, str(fd)], pass_fds=(fd,), env=env, close_fds=True)


def end_process(proc: subprocess.Popen, timeout: float) -> None:
    """Wait up to `timeout` for proc to exit, then terminate it, then kill it."""
    for end in (None, proc.terminate, proc.kill):
        if end is not None:
            end()
        try:
            proc.wait(timeout)
            return
        except subprocess.TimeoutExpired:
            continue


def exit_with_parent(parent_pid: int) -> None:
    """A worker must not outlive rank 0, also when rank 0 is killed while the worker is inside a
    collective (where a closed pipe is not noticed)."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="tritongen-tp-parent-watch", daemon=True).start()
