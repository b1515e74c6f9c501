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
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from tritongen.triton import control
from tritongen.triton.control import DRAIN_FILE_ENV  # the launcher's side of the drain contract


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


def has_tritonserver() -> bool:
    try:
        find_tritonserver()
    except FileNotFoundError:
        return False
    return True


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


CPU_ARGS = ("--allow-gpu-metrics=false", "--pinned-memory-pool-byte-size=0", "--cuda-memory-pool-byte-size=0:0")
"""On a machine without a GPU: no NVML/DCGM warnings, no failed pinned-memory allocation. One line
remains, an ERROR "CudaDriverHelper has not been initialized.": the GPU build of tritonserver logs it
unconditionally when it finds no driver (core server.cc, no flag turns it off); it is harmless."""

CPU_NOTE = "on CPU tritonserver's 'CudaDriverHelper has not been initialized' line is harmless"


STUB_NAME = "triton_python_backend_stub"
SHM_DIR = Path("/dev/shm")


def has_gpu() -> bool:
    """An NVIDIA driver is present (checked without importing torch)."""
    return Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia").exists()


@dataclass(frozen=True)
class StubProcess:
    """A Python-backend stub process of one tritonserver (read from /proc)."""

    pid: int
    model: str
    """The model directory's name (repo/<model>/<version>/model.py)."""
    shm_region: str
    """Its shared-memory region (/dev/shm/<shm_region>), which the server removes unless it crashed."""
    cmdline: tuple[str, ...]
    zombie: bool


def find_stubs(server_pid: int) -> list[StubProcess]:
    """Stubs launched by tritonserver `server_pid`, its own or orphaned: the stub's argv is
    [stub, model.py, shm region, shm size, growth size, parent pid, ...], so they are found by the
    parent pid in their command line even once the server is gone (never by name alone)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stub = _read_stub(int(entry))
        if stub is not None and len(stub.cmdline) > 5 and stub.cmdline[5] == str(server_pid):
            out.append(stub)
    return out


def _read_stub(pid: int) -> Optional[StubProcess]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = tuple(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
    except OSError:
        return None
    state = control.process_state(pid)
    if state is None or len(argv) < 3 or not argv[0].endswith(STUB_NAME):
        return None
    model = Path(argv[1]).parent.parent.name
    return StubProcess(pid, model, argv[2], argv, state in ("Z", "X"))


def reap_stubs(stubs: Sequence[StubProcess], timeout: float = 5.0) -> list[int]:
    """SIGKILL each stub still running (checked by its command line, so a reused PID is left
    alone; a stub ignores SIGTERM), wait for it, and remove its /dev/shm region. Returns the PIDs killed."""
    killed = []
    for stub in stubs:
        now = _read_stub(stub.pid)
        if now is not None and now.cmdline == stub.cmdline and not now.zombie:
            try:
                os.kill(stub.pid, signal.SIGKILL)
                killed.append(stub.pid)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout
    while killed and time.monotonic() < deadline:
        alive = [pid for pid in killed if (s := _read_stub(pid)) is not None and not s.zombie]
        if not alive:
            break
        time.sleep(0.05)
    for stub in stubs:
        region = SHM_DIR / stub.shm_region
        if stub.shm_region and "/" not in stub.shm_region and region.exists():
            try:
                region.unlink()
            except OSError:
                pass
    return killed


MAX_THREAD_POOL_SIZE = 1024
MIN_THREAD_POOL_SIZE = 64


def thread_pool_size_for(repo_dir: Path) -> int:
    """python_backend's thread-pool-size for a repository: twice the largest `max_num_seqs` of its
    models' config.pbtxt (the engine default where none says), within [64, 1024].

    A BLS request (llm_bls -> llm) holds a thread of its model instance's pool for its whole
    generation, so the pool bounds the BLS requests in flight: twice max_num_seqs keeps the engine
    full with as many again waiting in its queue (more wait for a thread, in order). Every Python
    model instance starts the whole pool at load, each thread a PID: a fixed 1024 made 8192 threads
    per server of the ensemble layout, and two test servers ran a machine with 32768 PIDs out of
    them (a stub that cannot start a thread aborts: "libgomp: Thread creation failed")."""
    from tritongen.config import SchedulerConfig
    from tritongen.triton.pbtxt import parameter_values

    seqs = []
    for config in Path(repo_dir).glob("*/config.pbtxt"):
        try:
            seqs += [int(v) for v in parameter_values(config.read_text(), "max_num_seqs") if v.isdigit()]
        except OSError:
            continue
    largest = max(seqs, default=SchedulerConfig.max_num_seqs)
    return min(MAX_THREAD_POOL_SIZE, max(MIN_THREAD_POOL_SIZE, 2 * largest))


@dataclass
class TritonServer:
    """One tritonserver process. Use as a context manager, or start() / wait_ready() / stop()."""

    repo_dir: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    host: str = "127.0.0.1"
    model_control: str = "none"
    """none (every model at start, fixed) | explicit (load/unload through the repository API) |
    poll (the repository is rescanned every repository_poll_s and changes are loaded)."""
    repository_poll_s: int = 15
    load_models: Sequence[str] = ()
    """With explicit model control: models loaded at start ("*" for all)."""
    log_file: Optional[Path] = None
    """Server log (stdout and stderr); None inherits the terminal."""
    exit_timeout_s: int = 10
    """How long tritonserver waits for in-flight requests when asked to stop."""
    cpu_only: Optional[bool] = None
    """Start without GPU features (CPU_ARGS); None: when the machine has no NVIDIA driver."""
    extra_args: Sequence[str] = ()
    thread_pool_size: Optional[int] = None
    """python_backend's thread-pool-size (BLS requests in flight per model instance); None:
    thread_pool_size_for(repo_dir)."""
    process: Optional[subprocess.Popen] = field(default=None, init=False)
    command_line: list[str] = field(default_factory=list, init=False)
    stubs: dict[int, StubProcess] = field(default_factory=dict, init=False)
    """Every stub seen of this server (refreshed by poll_stubs()): what stop() must leave dead."""
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
        if self.model_control == "poll":
            cmd.append(f"--repository-poll-secs={self.repository_poll_s}")
        if backend_dir is not None:
            cmd.append(f"--backend-directory={backend_dir}")
        # python_backend runs each BLS request on a thread of a pool of 32 by default, held for the
        # whole generation: llm_bls then never had more than 32 requests in the engine (H200,
        # concurrency 128: 29 on average, 0.63x the OpenAI server's RPS).
        pool = self.thread_pool_size or thread_pool_size_for(self.repo_dir)
        cmd.append(f"--backend-config=python,thread-pool-size={pool}")
        if self.cpu_only or (self.cpu_only is None and not has_gpu()):
            cmd += CPU_ARGS
        cmd += [f"--load-model={m}" for m in self.load_models]
        return cmd + list(self.extra_args)

    def start(self) -> "TritonServer":
        install = find_tritonserver()
        self._tmp = tempfile.TemporaryDirectory(prefix="tritongen-backends-")
        backend_dir = prepare_backend_dir(install, Path(self._tmp.name))
        out = open(self.log_file, "ab") if self.log_file else None
        env = server_env(install)
        env[DRAIN_FILE_ENV] = str(self.drain_file)
        self.stubs = {}
        self.command_line = self.command(install, backend_dir)
        try:
            # Own session: a Ctrl-C in the terminal reaches us, and we forward it once.
            self.process = subprocess.Popen(self.command_line, env=env,
                                            stdout=out, stderr=subprocess.STDOUT if out else None,
                                            start_new_session=True)
        finally:
            if out:
                out.close()
        return self

    @property
    def drain_file(self) -> Path:
        assert self._tmp is not None, "start() first"
        return Path(self._tmp.name) / "draining"

    def is_ready(self, model: Optional[str] = None) -> bool:
        """/v2/health/ready, or /v2/models/<model>/ready."""
        path = "/v2/health/ready" if model is None else f"/v2/models/{model}/ready"
        try:
            with urllib.request.urlopen(f"http://{self.http_url}{path}", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def poll_stubs(self) -> list[StubProcess]:
        """This server's stubs now (zombies included); each one is remembered for stop()."""
        if self.process is None:
            return []
        now = find_stubs(self.process.pid)
        self.stubs.update((s.pid, s) for s in now)
        return now

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

    def crash_excerpt(self, chars: int = 6000) -> str:
        """The server log from its last "Fatal Python error" on (a stub's faulthandler stacks),
        else its last lines that are not INFO."""
        text = Path(self.log_file).read_text(errors="replace") if self.log_file and Path(self.log_file).exists() else ""
        start = text.rfind("Fatal Python error")
        if start >= 0:
            return text[start:start + chars]
        return "\n".join(line for line in text.splitlines() if not line.startswith("I"))[-chars:]

    def _log_tail(self, chars: int = 4000) -> str:
        if not self.log_file or not Path(self.log_file).exists():
            return ""
        return "; log tail:\n" + Path(self.log_file).read_text(errors="replace")[-chars:]

    def stop(self, timeout: Optional[float] = None, kill: bool = False) -> Optional[int]:
        """Tell the engine model to drain, SIGTERM, wait for a clean shutdown (`timeout`, default the
        exit timeout + 5 s), else SIGKILL; `kill`: SIGKILL at once. Then no stub of this server is
        left and no /dev/shm region of theirs: tritonserver 2.51 exits with stubs alive when its
        exit timeout expires (they ignore SIGTERM and hang in their own exit path, parent 1)."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            self.poll_stubs()
            if not kill:
                self.drain_file.touch()
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=0 if kill else timeout if timeout is not None else self.exit_timeout_s + 5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if proc is not None:
            self.poll_stubs()  # orphans keep the server's pid in their argv
            reap_stubs(list(self.stubs.values()))
            for stale in control.token_path("*", proc.pid).parent.glob(f"{proc.pid}-*.token"):
                stale.unlink(missing_ok=True)  # a stub killed before its finalize leaves its file
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
