"""Find a tritonserver, prepare its Python backend for this interpreter, run it, stop it cleanly.

Without a system install (tritonserver on PATH, backends in /opt/tritonserver/backends) we use the
server inside the nvidia-pytriton wheel: its binary, its bundled libraries, its Python backend,
and the backend stub built for the running Python version, copied into a private backend
directory. The stub embeds libpython and takes its environment from the first `python3` on PATH,
so the launcher puts this interpreter's bin directory first and exports its package directories
(a source checkout included) on PYTHONPATH.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    lib_dirs: tuple[str, ...] = ()
    """Extra library directories (the wheel's bundled libraries)."""
    pytriton_root: Optional[Path] = None
    """pytriton/tritonserver of the wheel; None for a system install with its own backends."""


def find_tritonserver() -> TritonInstall:
    """$TRITONGEN_PYTRITON_DIR (a directory laid out like the wheel's site-packages part: pytriton/
    and nvidia_pytriton.libs/, e.g. the GPU bundle's), else tritonserver on PATH, else the binary
    inside the installed nvidia-pytriton wheel."""
    override = os.environ.get("TRITONGEN_PYTRITON_DIR")
    if override:
        package = Path(override) / "pytriton"
    elif shutil.which("tritonserver"):
        return TritonInstall(Path(shutil.which("tritonserver")))
    else:
        spec = importlib.util.find_spec("pytriton")  # locate without importing (it pins old numpy)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError("tritonserver not found: put it on PATH, or install the wheel that ships it "
                                    "(pip install 'tritongen[triton]', i.e. nvidia-pytriton)")
        package = Path(list(spec.submodule_search_locations)[0])
    root = package / "tritonserver"
    binary = root / "bin" / "tritonserver"
    if not binary.is_file():
        raise FileNotFoundError(f"{binary} is missing (broken nvidia-pytriton install?)")
    _make_executable(binary)  # unzipping the wheel by hand drops the run bit
    libs = package.parent / "nvidia_pytriton.libs"
    return TritonInstall(binary, (str(libs),) if libs.is_dir() else (), root)


def _make_executable(path: Path) -> None:
    mode = path.stat().st_mode
    if not mode & stat.S_IXUSR:
        path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def prepare_backend_dir(install: TritonInstall, dest: Path) -> Optional[Path]:
    """A backend directory whose python/ holds the wheel's backend plus the stub for this Python.
    Returns None for a system install (the server's own backend directory is used)."""
    if install.pytriton_root is None:
        return None
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = install.pytriton_root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise FileNotFoundError(f"the nvidia-pytriton wheel has no Python backend stub for Python {version}")
    python_dir = Path(dest) / "python"
    shutil.copytree(install.pytriton_root / "backends" / "python", python_dir, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(stub, python_dir / stub.name)
    _make_executable(python_dir / stub.name)
    return Path(dest)


def _python_path() -> list[str]:
    """This interpreter's package directories (not its standard library), for the stub."""
    paths = sysconfig.get_paths()
    stdlib = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib")}
    stdlib.add(os.path.join(os.path.realpath(paths["platstdlib"]), "lib-dynload"))
    out = [str(Path(__file__).resolve().parents[2])]  # the directory holding the tritongen package
    for entry in sys.path:
        real = os.path.realpath(entry) if entry else ""
        if real and os.path.isdir(real) and real not in stdlib and not real.endswith(".zip") and real not in out:
            out.append(real)
    return out


def server_env(install: TritonInstall, base: Optional[dict] = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    libdir = sysconfig.get_config_var("LIBDIR")
    soname = sysconfig.get_config_var("INSTSONAME") or ""
    lib_dirs = list(install.lib_dirs)
    if libdir and soname and (Path(libdir) / soname).exists():
        lib_dirs.append(libdir)  # the stub then loads this interpreter's libpython, not a system one
    env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_dirs + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(_python_path() + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


BLS_THREAD_POOL_SIZE = 1024
"""python_backend's thread-pool-size: how many BLS requests (llm_bls -> llm) can be in flight at once."""


@dataclass
class TritonServer:
    """One tritonserver process. Use as a context manager, or start() / wait_ready() / stop()."""

    repo_dir: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    host: str = "127.0.0.1"
    model_control: str = "none"
    """none | explicit (load/unload through the repository API)."""
    load_models: Sequence[str] = ()
    """With explicit model control: models loaded at start ("*" for all)."""
    log_file: Optional[Path] = None
    """Server log (stdout and stderr); None inherits the terminal."""
    exit_timeout_s: int = 10
    """How long tritonserver waits for in-flight requests when asked to stop."""
    extra_args: Sequence[str] = ()
    process: Optional[subprocess.Popen] = field(default=None, init=False)
    _tmp: Optional[tempfile.TemporaryDirectory] = field(default=None, init=False, repr=False)

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def command(self, install: TritonInstall, backend_dir: Optional[Path]) -> list[str]:
        cmd = [str(install.binary), f"--model-repository={self.repo_dir}",
               f"--http-address={self.host}", f"--http-port={self.http_port}",
               f"--grpc-address={self.host}", f"--grpc-port={self.grpc_port}",
               f"--metrics-address={self.host}", f"--metrics-port={self.metrics_port}",
               f"--exit-timeout-secs={self.exit_timeout_s}", f"--model-control-mode={self.model_control}"]
        if backend_dir is not None:
            cmd.append(f"--backend-directory={backend_dir}")
        # python_backend runs each BLS request on a thread of a pool of 32 by default, held for the
        # whole generation: llm_bls then never had more than 32 requests in the engine (H200,
        # concurrency 128: 29 on average, 0.63x the OpenAI server's RPS).
        cmd.append(f"--backend-config=python,thread-pool-size={BLS_THREAD_POOL_SIZE}")
        cmd += [f"--load-model={m}" for m in self.load_models]
        return cmd + list(self.extra_args)

    def start(self) -> "TritonServer":
        install = find_tritonserver()
        self._tmp = tempfile.TemporaryDirectory(prefix="tritongen-backends-")
        backend_dir = prepare_backend_dir(install, Path(self._tmp.name))
        out = open(self.log_file, "ab") if self.log_file else None
        try:
            # Own session: a Ctrl-C in the terminal reaches us, and we forward it once.
            self.process = subprocess.Popen(self.command(install, backend_dir), env=server_env(install),
                                            stdout=out, stderr=subprocess.STDOUT if out else None,
                                            start_new_session=True)
        finally:
            if out:
                out.close()
        return self

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise RuntimeError(f"tritonserver exited with code {code} before it was ready{self._log_tail()}")
            if self.is_ready():
                return
            time.sleep(0.25)
        raise TimeoutError(f"tritonserver not ready after {timeout:.0f} s{self._log_tail()}")

    def _log_tail(self, chars: int = 4000) -> str:
        if not self.log_file or not Path(self.log_file).exists():
            return ""
        return "; log tail:\n" + Path(self.log_file).read_text(errors="replace")[-chars:]

    def stop(self, timeout: Optional[float] = None) -> Optional[int]:
        """SIGTERM, wait for a clean shutdown, then SIGKILL the server's process group if needed."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout if timeout is not None else self.exit_timeout_s + 20)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # the group we created: server and stubs
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        return None if proc is None else proc.returncode

    def __enter__(self) -> "TritonServer":
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(args) -> int:
    """`tritongen serve --frontend triton`: write the repository, run tritonserver until a signal."""
    from tritongen.cli import engine_kwargs
    from tritongen.fetch import resolve_model
    from tritongen.triton.repo import write_repository

    options = engine_kwargs(args)
    options["model"] = resolve_model(options.get("model"))  # fetch the default model here, visibly, once
    tmp = None
    repo_dir = args.repo_dir
    if repo_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="tritongen-repo-")
        repo_dir = tmp.name
    write_repository(repo_dir, options, layout=args.layout, name=args.name)
    server = TritonServer(Path(repo_dir), http_port=args.http_port, grpc_port=args.grpc_port,
                          metrics_port=args.metrics_port, host=getattr(args, "host", "127.0.0.1"))
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        _wait_ready_or_stop(server, stop)
        if not stop.is_set():
            _print_endpoints(server, args, repo_dir)
        while not stop.is_set() and server.process.poll() is None:
            stop.wait(0.5)
    finally:
        print("tritongen: stopping tritonserver…", file=sys.stderr, flush=True)
        code = server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if tmp is not None:
            tmp.cleanup()
    return 0 if stop.is_set() else (code or 0)


def _wait_ready_or_stop(server: TritonServer, stop: threading.Event) -> None:
    while not stop.is_set():
        if server.process.poll() is not None:
            raise RuntimeError(f"tritonserver exited with code {server.process.returncode} before it was ready")
        if server.is_ready():
            return
        stop.wait(0.5)


def _print_endpoints(server: TritonServer, args, repo_dir: str) -> None:
    name = args.name
    lines = [
        f"tritongen: Triton is ready (model repository {repo_dir})",
        f"  HTTP     http://{server.http_url}  e.g. POST /v2/models/{name}/generate_stream, "
        f"/v2/models/{name}_bls/generate, /v2/models/{name}_bls/infer",
        f"  gRPC     {server.grpc_url}  (stream to '{name}', unary to '{name}_bls')",
        f"  metrics  {server.metrics_url}",
    ]
    if args.layout == "ensemble":
        lines.append("  ensemble model 'ensemble' (TensorRT-LLM names)")
    print("\n".join(lines), flush=True)
