"""`tritongen serve --frontend openai`: listen, load the engine, serve until a signal.

The port is bound before the model loads, so a port in use fails in one line at once rather than
after minutes of loading. The model loads in a worker thread while the main thread waits for
it or for SIGINT/SIGTERM: a KeyboardInterrupt raised inside loading code can be swallowed by it
(a library's broad except, or C code that never returns to Python), and the server would then
go on to serve (issue 28, item 11). Here Ctrl-C always stops the process, at any point.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading

import uvicorn

# A stop asked for by a signal is a clean exit, while loading or while serving, as with the
# Triton frontend.
EXIT_STOPPED = 0


def serve(args) -> int:
    from tritongen.config_cli import engine_kwargs

    try:
        sock = _listen(args.host, args.port)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        kwargs = engine_kwargs(args)
        engine = _load_or_stop(kwargs, stop)
        if engine is None:
            return EXIT_STOPPED
        try:
            _run(engine, args, kwargs, sock, stop)
        finally:
            engine.shutdown()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    return 0


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: restart over TIME_WAIT
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _load_or_stop(kwargs: dict, stop: threading.Event):
    """The AsyncLLM, or None if a signal came first. Load errors are raised here, in the main thread."""
    from tritongen.entrypoints.async_engine import AsyncLLM

    result: dict = {}

    def load() -> None:
        try:
            result["engine"] = AsyncLLM(**kwargs)
        except BaseException as exc:  # handed to the main thread, which reports it
            result["error"] = exc

    loader = threading.Thread(target=load, name="tritongen-load", daemon=True)
    loader.start()
    while loader.is_alive() and not stop.is_set():
        loader.join(0.1)
    if stop.is_set():
        print("tritongen: interrupted while loading the model; exiting", file=sys.stderr, flush=True)
        if loader.is_alive():
            # The loader cannot be interrupted and owns nothing outside this process (an engine
            # process exits with its parent), so leave without waiting for it.
            sys.stdout.flush()
            os._exit(EXIT_STOPPED)
        if "engine" in result:
            result["engine"].shutdown()
        return None
    if "error" in result:
        raise result["error"]
    return result["engine"]


def _run(engine, args, kwargs: dict, sock: socket.socket, stop: threading.Event) -> None:
    from tritongen.openai.server import DEFAULT_MAX_BODY_BYTES, build_app, model_name_for

    name = args.served_model_name or model_name_for(kwargs.get("model"))
    app = build_app(engine, served_model_name=name, api_key=args.api_key, max_queue=args.max_queue,
                    max_num_seqs=kwargs.get("max_num_seqs"),
                    max_body_bytes=getattr(args, "max_body_bytes", DEFAULT_MAX_BODY_BYTES))
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
    server = _ReadyServer(config, stop, lambda: _print_ready(sock, name, args.api_key is not None))
    server.run(sockets=[sock])


class _ReadyServer(uvicorn.Server):
    """uvicorn.Server that prints the ready line once it listens, and does not start serving if a
    signal came while it was starting (uvicorn's own handlers are in place only from then on)."""

    def __init__(self, config: uvicorn.Config, stop: threading.Event, on_ready) -> None:
        super().__init__(config)
        self._stop, self._on_ready = stop, on_ready

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if self._stop.is_set():
            self.should_exit = True
        elif self.started and not self.should_exit:
            self._on_ready()


def _print_ready(sock: socket.socket, model_name: str, needs_key: bool) -> None:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    base = f"http://{shown}:{port}"
    lines = [
        f"tritongen: OpenAI API server is ready (model '{model_name}')",
        f"  HTTP     {base}/v1  e.g. POST {base}/v1/chat/completions, {base}/v1/completions; "
        f"GET {base}/v1/models",
        f"  health   {base}/health",
        f"  metrics  {base}/metrics",
    ]
    if needs_key:
        lines.append("  requests need 'Authorization: Bearer <api key>'")
    print("\n".join(lines), flush=True)

