"""`tritongen repo` (registered by cli.py) and `tritongen serve --frontend triton`: check what can be
checked before anything starts, then run tritonserver under a supervisor that brings a dead engine
model back without an operator."""
from __future__ import annotations

import argparse
import collections
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from tritongen.config import DEFAULT_MAX_QUEUE
from tritongen.triton import control
from tritongen.triton.launcher import CPU_NOTE, TritonServer


def register(subparsers) -> None:
    from tritongen.config_cli import add_engine_args

    p = subparsers.add_parser("repo", help="write a Triton model repository for a model")
    p.add_argument("--out", required=True, help="repository directory (created; our model folders are replaced)")
    p.add_argument("--layout", choices=["default", "ensemble"], default="default",
                   help="default: llm, llm_bls, fastertransformer; ensemble: also TensorRT-LLM's ensemble, "
                        "tensorrt_llm, <name>_tokens and tensorrt_llm_bls")
    p.add_argument("--name", default="llm", help="name of the decoupled engine model (the BLS front is <name>_bls)")
    p.add_argument("--version", type=int, default=1, help="version folder to write")
    p.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE,
                   help="requests the engine model lets wait beyond max_num_seqs; more get UNAVAILABLE at once "
                        "(model parameter max_queue; 0 = unbounded)")
    p.add_argument("--version-policy", default=None, metavar="POLICY",
                   help="version_policy of every model: latest:N, all, or specific:V[,V...] "
                        "(default: Triton's, the latest version)")
    p.add_argument("--stream-interval", type=int, default=None, metavar="N",
                   help="tokens per streamed response of the engine model (parameter stream_interval; default 1)")
    p.add_argument("--sender-threads", type=int, default=None, metavar="N",
                   help="concurrent response sends of the engine model (parameter sender_threads; "
                        "default: an eighth of max_num_seqs within [8, 32])")
    add_engine_args(p)
    p.set_defaults(func=cmd_repo)


def cmd_repo(args: argparse.Namespace) -> int:
    from tritongen.config_cli import engine_kwargs
    from tritongen.triton.repo import write_repository

    try:
        root = write_repository(args.out, engine_kwargs(args), layout=args.layout, name=args.name,
                                version=args.version, max_queue=args.max_queue, stream_interval=args.stream_interval,
                                sender_threads=args.sender_threads, policy=args.version_policy)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    models = sorted(p.name for p in root.iterdir() if (p / "config.pbtxt").is_file())
    print(f"wrote {root}: {', '.join(models)}")
    return 0


# -- checks before anything starts ------------------------------------------------------------


class ServeError(RuntimeError):
    """`tritongen serve` cannot go on; the message is the one line the user sees."""


def check_model(model: Optional[str]) -> None:
    """`--model` names something we can load: None (the default model), dummy:<known preset>, or
    an HF directory with config.json. Checked before tritonserver starts, not 10 s into its load."""
    if model is None:
        return
    from tritongen.models.presets import PRESETS

    if model.startswith("dummy:"):
        if model[len("dummy:"):] not in PRESETS:
            raise ServeError(f"unknown dummy preset {model!r}; available: {', '.join('dummy:' + p for p in PRESETS)}")
        return
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ServeError(f"--model {model!r}: no such directory (pass an HF model directory with config.json, "
                         f"or dummy:<preset> with one of: {', '.join(PRESETS)})")
    if not (path / "config.json").is_file():
        raise ServeError(f"--model {model!r}: the directory has no config.json (not an HF model directory)")


def check_model_control(mode: str, load: Optional[list[str]]) -> None:
    """--load-model only means something with explicit model control (tritonserver refuses it otherwise)."""
    if load and mode != "explicit":
        raise ServeError(f"--load-model needs --model-control-mode explicit (got {mode}: "
                         f"{'every model loads at start' if mode == 'none' else 'the repository decides'})")


def check_version_policy(policy: Optional[str]) -> None:
    from tritongen.triton.pbtxt import version_policy

    try:
        version_policy(policy)
    except ValueError as exc:
        raise ServeError(f"--version-policy: {exc}") from None


def check_ports(host: str, ports: dict[str, int]) -> None:
    """Each port is free on `host` and they differ ({flag: port}); one line names the culprit."""
    seen: dict[int, str] = {}
    for flag, port in ports.items():
        if port in seen:
            raise ServeError(f"{flag} and {seen[port]} are both {port}; give each its own port")
        seen[port] = flag
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as tritonserver binds
            try:
                s.bind((host, port))
            except OSError as exc:
                raise ServeError(f"port {port} ({flag}) on {host} is not free ({exc.strerror}); "
                                 f"stop what holds it or choose another with {flag}") from None


# -- supervision -----------------------------------------------------------------------------


@dataclass
class Supervisor:
    """Runs tritonserver and keeps `model` (and every other Python model) serving.

    When the engine model's stub process dies (kill -9, OOM killer, or the model's own exit when its
    engine cannot be restarted), python_backend 24.10 neither restarts it nor ends its in-flight
    requests: their response factories live on in the server, gRPC and SSE streams hang forever,
    readiness stays green, and an unload never completes (measured, see docs/reliability.md). The
    only way to end those requests is to end the server process, so the supervisor restarts
    tritonserver: clients in flight see their connection close at once (gRPC: UNAVAILABLE), the
    ports refuse connections (not ready) until the new server is ready, and nothing is leaked."""

    make_server: Callable[[], TritonServer]
    model: str
    stop: threading.Event
    log: Callable[[str], None] = lambda msg: print(f"tritongen: {msg}", file=sys.stderr, flush=True)
    poll_s: float = 0.5
    grace_s: float = 1.0
    """After a death is seen: time for llm_bls to answer its own requests UNAVAILABLE before the server goes."""
    max_restarts: int = 5
    window_s: float = 600.0
    """More than max_restarts within window_s: give up (exit 1) and leave it to the orchestrator."""
    server: Optional[TritonServer] = None
    restarts: collections.deque = field(default_factory=collections.deque)
    last_pids: dict = field(default_factory=dict)
    """{model: the last live stub pid seen of the current server}, to name the one that died."""

    def run(self, on_ready: Callable[[TritonServer, bool], None]) -> int:
        first = True
        try:
            while not self.stop.is_set():
                self.server = self.make_server().start()
                began = time.monotonic()
                ready = self._wait_ready(first)
                if self.stop.is_set():
                    return 0
                if ready:
                    on_ready(self.server, first)
                    if not first:
                        self.log(f"back in service ({time.monotonic() - began:.1f} s after the restart)")
                    first = False
                    reason = self._watch()
                else:
                    reason = f"tritonserver exited with code {self.server.process.returncode} before it was ready"
                if reason is None:
                    return 0
                if not self._may_restart(reason):
                    return 1
                time.sleep(self.grace_s)
                self.server.stop(kill=True)
            return 0
        finally:
            if self.server is not None:
                self.log("stopping tritonserver…")
                self.server.stop()

    def _wait_ready(self, first: bool) -> bool:
        while not self.stop.is_set():
            if self.server.process.poll() is not None:
                if first:
                    raise ServeError(f"tritonserver exited with code {self.server.process.returncode} "
                                     "before it was ready (its log is above)")
                return False
            if self.server.is_ready():
                return True
            self.stop.wait(0.25)
        return False

    def _watch(self) -> Optional[str]:
        """Poll until a stop (None) or a death (its description).

        Watched: every Python model of the repository (a model.py in a version folder) and every
        model a stub was seen for; the engine's death ends its requests, and a dead forwarding
        model's stub (llm_bls) leaves its requests hanging and every later one failing while Triton
        keeps calling the model ready. A death is no live stub of a model two polls in a row while
        Triton calls that model ready: a READY model always has its stub, and an unload or reload
        through the repository API takes the model out of READY, or starts its new stub, before
        the old stub goes."""
        misses: dict[str, int] = {}
        self.last_pids = {}
        while not self.stop.wait(self.poll_s):
            if self.server.process.poll() is not None:
                return f"tritonserver exited with code {self.server.process.returncode}"
            live = self._live_stubs()
            watched = {self.model} | python_models(Path(self.server.repo_dir)) | set(self.last_pids)
            for model in sorted(watched - set(live)):
                misses[model] = misses.get(model, 0) + 1
                if misses[model] >= 2 and self.server.is_ready(model):
                    pid = control.engine_pid(model, self.server.process.pid) or self.last_pids.get(model)
                    return f"the stub process of model {model!r} (pid {pid if pid else '?'}) died"
            for model in live:
                misses.pop(model, None)
        return None

    def _live_stubs(self) -> dict[str, int]:
        """{model: pid of a live stub}. The engine model's stub records its pid when it loads
        (triton/control.py) and that pid is checked directly; other models' stubs (and an engine
        model that records none) are found by a /proc scan, which also remembers every stub for stop()."""
        live: dict[str, int] = {}
        for stub in self.server.poll_stubs():
            if not stub.zombie:
                live.setdefault(stub.model, stub.pid)
            else:  # dead before any poll saw it alive: still name it
                self.last_pids.setdefault(stub.model, stub.pid)
        recorded = control.engine_pid(self.model, self.server.process.pid)
        if recorded is not None:
            if control.process_alive(recorded):
                live[self.model] = recorded
            else:
                live.pop(self.model, None)
        self.last_pids.update(live)
        return live

    def _may_restart(self, reason: str) -> bool:
        now = time.monotonic()
        self.restarts.append(now)
        while self.restarts and self.restarts[0] < now - self.window_s:
            self.restarts.popleft()
        if len(self.restarts) > self.max_restarts:
            self.log(f"{reason}; {len(self.restarts)} restarts within {self.window_s:.0f} s: giving up")
            return False
        self.log(f"{reason}; restarting tritonserver (requests in flight end now: python_backend cannot end them)")
        return True


def python_models(repo_dir: Path) -> set[str]:
    """The repository's Python-backend models: those with a model.py in a version folder."""
    try:
        return {path.parent.parent.name for path in repo_dir.glob("*/*/model.py")}
    except OSError:
        return set()


def serve_triton(args) -> int:
    """`tritongen serve --frontend triton`: checks, repository, supervised tritonserver until a signal."""
    host = getattr(args, "host", "127.0.0.1")
    try:
        check_model(args.model)
        check_model_control(getattr(args, "model_control_mode", "explicit"), getattr(args, "load_model", None))
        check_version_policy(getattr(args, "version_policy", None))
        pool = getattr(args, "thread_pool_size", None)
        if pool is not None and pool < 1:
            raise ServeError(f"--thread-pool-size must be at least 1 (threads per Python model instance), got {pool}")
        check_ports(host, {"--http-port": args.http_port, "--grpc-port": args.grpc_port,
                           "--metrics-port": args.metrics_port})
        return _serve_checked(args, host)
    except ServeError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2


def _serve_checked(args, host: str) -> int:
    from tritongen.config_cli import engine_kwargs
    from tritongen.fetch import resolve_model
    from tritongen.triton.repo import write_repository

    options = engine_kwargs(args)
    options["model"] = resolve_model(options.get("model"))  # fetch the default model here, visibly, once
    tmp = None
    repo_dir = args.repo_dir
    if repo_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="tritongen-repo-")
        repo_dir = tmp.name
    try:
        write_repository(repo_dir, options, layout=args.layout, name=args.name,
                         max_queue=getattr(args, "max_queue", DEFAULT_MAX_QUEUE),
                         stream_interval=getattr(args, "stream_interval", None),
                         sender_threads=getattr(args, "sender_threads", None),
                         policy=getattr(args, "version_policy", None))
    except ValueError as exc:
        raise ServeError(str(exc)) from None
    mode = getattr(args, "model_control_mode", "explicit")
    load = (getattr(args, "load_model", None) or ["*"]) if mode == "explicit" else []
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}

    def make_server() -> TritonServer:
        return TritonServer(Path(repo_dir), http_port=args.http_port, grpc_port=args.grpc_port,
                            metrics_port=args.metrics_port, host=host, model_control=mode, load_models=load,
                            thread_pool_size=getattr(args, "thread_pool_size", None))

    try:
        supervisor = Supervisor(make_server, args.name, stop)
        return supervisor.run(lambda server, first: first and _print_endpoints(server, args, repo_dir))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if tmp is not None:
            tmp.cleanup()


def _print_endpoints(server: TritonServer, args, repo_dir: str) -> None:
    name = args.name
    lines = [
        f"tritongen: Triton is ready (model repository {repo_dir}, model control "
        f"{getattr(args, 'model_control_mode', 'explicit')})",
        f"  HTTP     http://{server.http_url}  e.g. POST /v2/models/{name}/generate_stream, "
        f"/v2/models/{name}_bls/generate, /v2/models/{name}_bls/infer",
        f"  gRPC     {server.grpc_url}  (stream to '{name}', unary to '{name}_bls'; "
        "FasterTransformer clients: 'fastertransformer')",
        f"  metrics  {server.metrics_url}",
    ]
    if args.layout == "ensemble":
        lines.append(f"  TensorRT-LLM models: 'ensemble', 'tensorrt_llm' (unary), '{name}_tokens' and "
                     "'tensorrt_llm_bls' (streaming)")
    if "--allow-gpu-metrics=false" in server.command_line:
        lines.append(f"  ({CPU_NOTE})")
    print("\n".join(lines), flush=True)
