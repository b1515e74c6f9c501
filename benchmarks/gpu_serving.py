"""Serving at one concurrency through our OpenAI server and through Triton (`llm` over gRPC streaming,
`llm_bls` over HTTP /generate), one server at a time with the same engine options; prints a table
with the Triton/OpenAI RPS ratios and writes the rows as JSON (after every target, so a run cut
short keeps what it measured).

GPU machine, after benchmarks/triton_gpu/setup_remote.sh (docs/bench.md, "Serving on the GPU machine"):
    . /tmp/tritongen-gpu/env.sh && python3 benchmarks/gpu_serving.py --model dummy:llama-2-7b \
        --json-out $OUT/serving_7b.json --log-dir $OUT
Here, on CPU, the whole path with the tiny model and the installed nvidia-pytriton wheel:
    python benchmarks/gpu_serving.py --model dummy:tiny-llama --device cpu --num-prompts 16 --concurrency 4

Fairness: every server starts cold; prefix caching is off unless --enable-prefix-caching is given
(the sharegpt-like prompts share no block anyway, and llm_bls, which shares a tritonserver with
`llm`, would otherwise find the prompts the gRPC run left cached; with it on, Triton is restarted
between the two). Before each measured run `--warmup-prompts` other prompts with 16 output tokens
warm the server (Triton kernels compile on first use). `client_cpu` is this process's CPU seconds
per second of the run: near 1.0 means the load generator, not the server, set the pace. The
engine's step counters, scraped from the server's metrics before and after each measured run, give
the share of steps that carried prompt tokens (what stretches TPOT) and of steps launched ahead by
asynchronous scheduling.
Dummy Llama-2 shapes have 32000 ids, fewer than the default tokenizer's 49152: without --tokenizer
they get $TRITONGEN_LLAMA2_TOKENIZER (shipped in the bundle), for both the servers and the prompts.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from tritongen.config_cli import add_engine_args, engine_kwargs  # noqa: E402
from tritongen.netutil import free_ports  # noqa: E402

TARGETS = {"openai": "openai", "triton": "triton-grpc", "bls": "triton-bls"}
WARMUP_OUTPUT_LEN = 16
METRICS_SETTLE_S = 2.0
_T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - _T0:6.1f}s] {msg}", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", default="openai,triton,bls", help="any of openai, triton (gRPC stream), bls")
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--dataset", default="sharegpt-like", help="as `tritongen bench serve --dataset`")
    ap.add_argument("--warmup-prompts", type=int, default=None, help="default: the concurrency; 0: none")
    ap.add_argument("--max-duration", type=float, default=240.0,
                    help="seconds per target after which no request is sent (in-flight ones get 30 s more)")
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--ready-timeout", type=float, default=300.0, help="seconds a server may take to start")
    ap.add_argument("--json-out", default=None, help="write the rows here (a JSON list)")
    ap.add_argument("--log-dir", default=None, help="server logs (default: a temporary directory)")
    ap.add_argument("--sender-threads", type=int, default=None,
                    help="the `llm` model's concurrent response sends (its parameter sender_threads; default an eighth "
                         "of --max-num-seqs within [8, 32])")
    add_engine_args(ap)  # --model, --tokenizer, --dtype, --device, --max-num-seqs, ... go to every server
    # dtype: bfloat16 on the GPU, float32 on CPU; prefix caching off (see the docstring).
    ap.set_defaults(model="dummy:llama-2-7b", dtype=None, enable_prefix_caching=False)
    args = ap.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if on_gpu(args.device) else "float32")
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = [t for t in args.targets if t not in TARGETS]
    if unknown:
        ap.error(f"unknown targets {unknown}; choose from {', '.join(TARGETS)}")
    return args


def on_gpu(device: str) -> bool:
    if device != "auto":
        return device.startswith("cuda")
    import torch

    return torch.cuda.is_available()  # no CUDA context: the servers need the whole GPU


# -- tokenizer and requests -----------------------------------------------------------------------

def pick_tokenizer(args: argparse.Namespace) -> tuple[object, str]:
    """The tokenizer for prompts and servers: the first candidate whose ids fit the model's vocabulary."""
    from tritongen.fetch import default_model_dir, is_complete, resolve_model
    from tritongen.models.loader import hf_config_dict, is_dummy
    from tritongen.tokenizer import load_tokenizer

    if args.tokenizer or not is_dummy(args.model):
        paths = [args.tokenizer or args.model]
    else:  # the default model's tokenizer when it is here, then the bundle's Llama-2 one
        paths = [str(default_model_dir())] if is_complete(default_model_dir()) else []
        paths += [p for p in [os.environ.get("TRITONGEN_LLAMA2_TOKENIZER")] if p]
        paths = paths or [resolve_model(None)]  # fetches the default model (needs the network)
    vocab = hf_config_dict(args.model)["vocab_size"]
    for path in paths:
        tok = load_tokenizer(path)
        if len(tok) <= vocab:
            return tok, str(path)
    raise SystemExit(f"no tokenizer in {paths} fits the model's {vocab} ids: pass --tokenizer "
                     "(the bundle's Llama-2 tokenizer fits Llama-2 shapes)")


def make_requests(args: argparse.Namespace, tokenizer) -> tuple[list, list]:
    from tritongen.bench.datasets import load_dataset

    requests = load_dataset(args.dataset, args.num_prompts, args.seed, tokenizer)
    n_warm = args.concurrency if args.warmup_prompts is None else args.warmup_prompts
    warm = load_dataset(args.dataset, n_warm, args.seed + 1000, tokenizer) if n_warm else []
    for r in warm:
        r.output_len = min(r.output_len, WARMUP_OUTPUT_LEN)
    return requests, warm


# -- one load ---------------------------------------------------------------------------------------

def run_load(kind: str, url: str, tokenizer, requests: list, args: argparse.Namespace) -> dict:
    """One closed-loop run at --concurrency; the bench summary plus client_cpu."""
    from tritongen.bench.loadgen import LoadShape, run_serve_benchmark
    from tritongen.bench.results import summarize
    from tritongen.bench.target_kinds import make_target

    target = make_target(kind, url, None, tokenizer, args.concurrency, args.request_timeout)
    shape = LoadShape(concurrency=args.concurrency, max_duration=args.max_duration, grace=30.0,
                      request_timeout=args.request_timeout)
    cpu0 = time.process_time()
    records, elapsed = asyncio.run(run_serve_benchmark(target, requests, shape, 0, False))
    summary = summarize(records, elapsed, {"target": kind, "model": args.model, "concurrency": args.concurrency})
    summary["client_cpu"] = (time.process_time() - cpu0) / max(elapsed, 1e-9)
    return summary


ENGINE_SERIES = ("tritongen_engine_steps_total", "tritongen_engine_prefill_steps_total",
                 "tritongen_engine_steps_ahead_total", "tritongen_num_preemptions_total",
                 "tritongen_engine_decode_step_seconds_total", "tritongen_engine_prefill_step_seconds_total",
                 "tritongen_engine_mixed_graph_steps_total")


GAUGE_SERIES = ("tritongen_num_requests_running", "tritongen_num_requests_waiting")
PEER_GAUGE_SERIES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
"""The same two gauges under vLLM's names: vLLM exports them, and so does our OpenAI server (the
names the Gateway API Inference Extension reads), so one sampler compares the two servers."""
GAUGE_PERIOD_S = 0.5


def scrape_engine_counters(metrics_url: str, series: tuple[str, ...] = ENGINE_SERIES,
                           require: bool = False) -> dict[str, float]:
    """The engine's step counters (or other series) from a Prometheus text page, summed over label
    sets; a series the page lacks counts 0, or (require) raises KeyError."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    out = dict.fromkeys(series, 0.0)
    seen = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in out:
                out[sample.name] += sample.value
                seen.add(sample.name)
    if require and seen != set(series):
        raise KeyError(f"{metrics_url} has no {', '.join(sorted(set(series) - seen))}")
    return out


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` so far (not its children's), from /proc; None
    where there is no /proc or the process is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def front_cpu(pid: int, before: float | None, summary: dict) -> dict:
    """The server process's CPU over a run that began at CPU time `before`: seconds per second of
    the run, and microseconds per output token. The front's share of serving work (HTTP, SSE,
    detokenizing where it runs there), apart from an engine in a child process."""
    after = process_cpu_seconds(pid)
    elapsed, tokens = summary.get("elapsed_time"), summary.get("completion_tokens")
    if before is None or after is None or not elapsed:
        return {"server_cpu": None, "server_cpu_us_per_token": None}
    return {"server_cpu": (after - before) / elapsed,
            "server_cpu_us_per_token": 1e6 * (after - before) / tokens if tokens else None}


def engine_mix(before: dict, after: dict) -> dict:
    """Steps of the measured run: how many, the share with prompt tokens (and of those, the share
    replayed from a mixed-step CUDA graph), the share launched ahead, and the mean length (ms) of
    steps with and without prompt tokens."""
    d = {k: after[k] - before[k] for k in ENGINE_SERIES}
    steps, prefill = d["tritongen_engine_steps_total"], d["tritongen_engine_prefill_steps_total"]
    mean_ms = lambda seconds, n: 1e3 * seconds / n if n else None  # noqa: E731
    return {"engine_steps": steps, "preemptions": d["tritongen_num_preemptions_total"],
            "prefill_step_share": prefill / steps if steps else None,
            "mixed_graph_share": d["tritongen_engine_mixed_graph_steps_total"] / prefill if prefill else None,
            "ahead_step_share": d["tritongen_engine_steps_ahead_total"] / steps if steps else None,
            "decode_step_ms": mean_ms(d["tritongen_engine_decode_step_seconds_total"], steps - prefill),
            "prefill_step_ms": mean_ms(d["tritongen_engine_prefill_step_seconds_total"], prefill)}


def measured_load(kind: str, url: str, tokenizer, requests: list, args, metrics_url: str,
                  gauge_series: tuple[str, str] = GAUGE_SERIES, engine_steps: bool = True,
                  server_pid: int | None = None) -> dict:
    """run_load's summary plus what the server's /metrics tell about the run: the mean running /
    waiting gauges (`gauge_series`), with `engine_steps` our engine's step mix (engine_mix), with
    `server_pid` the server process's CPU (front_cpu)."""
    if engine_steps:
        time.sleep(METRICS_SETTLE_S)  # the frontends export the engine counters on a timer
        before = scrape_engine_counters(metrics_url)
    cpu_before = process_cpu_seconds(server_pid) if server_pid is not None else None
    with GaugeSampler(metrics_url, gauge_series) as gauges:
        s = run_load(kind, url, tokenizer, requests, args)
    s.update(gauges.means())
    if server_pid is not None:
        s.update(front_cpu(server_pid, cpu_before, s))
    if engine_steps:
        time.sleep(METRICS_SETTLE_S)
        s.update(engine_mix(before, scrape_engine_counters(metrics_url)))
    return s


def bench_target(kind: str, url: str, tokenizer, requests: list, warm: list, args, metrics_url: str) -> dict:
    if warm:
        s = run_load(kind, url, tokenizer, warm, args)
        log(f"{kind}: warm-up {s['completed']}/{len(warm)} ok in {s['elapsed_time']:.1f} s")
        if not s["completed"]:
            raise RuntimeError(f"every warm-up request failed: {s.get('first_error')}")
    log(f"{kind}: {len(requests)} requests at concurrency {args.concurrency}")
    s = measured_load(kind, url, tokenizer, requests, args, metrics_url)
    from tritongen.bench.results import format_summary

    print(format_summary(s), flush=True)
    log(f"{kind}: {s['engine_steps']:.0f} engine steps, {_pct(s['prefill_step_share'])} with prompt tokens "
        f"({_f(s['prefill_step_ms'], '.2f')} ms against {_f(s['decode_step_ms'], '.2f')} ms without; "
        f"{_pct(s['mixed_graph_share'])} of them replayed a CUDA graph), {_pct(s['ahead_step_share'])} launched "
        f"ahead, {s['preemptions']:.0f} preemptions; "
        f"requests in the engine: {_f(s.get('engine_running'))} running, {_f(s.get('engine_waiting'))} waiting (mean)")
    return s


class GaugeSampler:
    """Samples the engine's running / waiting gauges every GAUGE_PERIOD_S during a run: with the
    client's concurrency, they tell where requests wait (engine queue, or before the engine)."""

    def __init__(self, metrics_url: str, series: tuple[str, str] = GAUGE_SERIES) -> None:
        self.url, self.series, self.samples = metrics_url, series, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(GAUGE_PERIOD_S):
            try:
                self.samples.append(scrape_engine_counters(self.url, self.series, require=True))
            except Exception:  # noqa: BLE001 - a missed sample only thins the mean; none at all gives None
                pass

    def __enter__(self) -> "GaugeSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def means(self) -> dict:
        n = len(self.samples)
        mean = lambda k: sum(x[k] for x in self.samples) / n if n else None  # noqa: E731
        return {"engine_running": mean(self.series[0]), "engine_waiting": mean(self.series[1])}


def _f(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _pct(share) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def sender_threads(args) -> int:
    """The `llm` model's sender threads in this run: --sender-threads, else its default."""
    from tritongen.config import SchedulerConfig
    from tritongen.triton.llm_model import default_sender_threads

    return args.sender_threads or default_sender_threads(args.max_num_seqs or SchedulerConfig().max_num_seqs)


def row(kind: str, args, summary: dict | None, start_s: float | None, error: str | None = None) -> dict:
    s = summary or {}
    ms = lambda key, p: (s.get(key) or {}).get(p)  # noqa: E731
    return {"target": kind, "model": args.model, "rps": s.get("rps"), "rpm": s.get("rpm"),
            "ttft_p50_ms": ms("ttft_ms", "p50"), "ttft_p99_ms": ms("ttft_ms", "p99"),
            "tpot_p50_ms": ms("tpot_ms", "p50"), "tpot_p99_ms": ms("tpot_ms", "p99"),
            "itl_p50_ms": ms("itl_ms", "p50"), "num_ok": s.get("completed", 0),
            "num_err": s.get("errors", args.num_prompts if error else 0),
            "output_tok_s": s.get("output_tok_s"), "elapsed_s": s.get("elapsed_time"),
            "concurrency": args.concurrency, "num_prompts": args.num_prompts, "server_start_s": start_s,
            "client_cpu": s.get("client_cpu"), "engine_steps": s.get("engine_steps"),
            "prefill_step_share": s.get("prefill_step_share"), "mixed_graph_share": s.get("mixed_graph_share"),
            "ahead_step_share": s.get("ahead_step_share"),
            "decode_step_ms": s.get("decode_step_ms"), "prefill_step_ms": s.get("prefill_step_ms"),
            "server_cpu": s.get("server_cpu"), "server_cpu_us_per_token": s.get("server_cpu_us_per_token"),
            "preemptions": s.get("preemptions"), "engine_running": s.get("engine_running"),
            "engine_waiting": s.get("engine_waiting"), "sender_threads": sender_threads(args) if kind.startswith("triton-") else None,
            "error": error or s.get("first_error")}


# -- servers ----------------------------------------------------------------------------------------

def cli_flags(options: dict) -> list[str]:
    """Engine options back to `tritongen serve` flags."""
    out = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            out += [flag, str(value)]
    return out


def wait_group_gone(pgid: int, timeout: float = 30.0) -> None:
    """Wait until no process of the group we started (server, Triton stubs) is left: the next
    server needs the GPU memory they hold. SIGKILL whatever is left after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def gpu_memory_used() -> str:
    if not shutil.which("nvidia-smi"):
        return ""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"],
                         capture_output=True, text=True)
    return f"; GPU memory used: {out.stdout.strip()}"


class OpenAIServer:
    """`tritongen serve --frontend openai` in its own process group, on a free 127.0.0.1 port."""

    def __init__(self, options: dict, log_file: Path) -> None:
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "tritongen.cli", "serve", "--frontend", "openai", "--host", "127.0.0.1",
                    "--port", str(self.port), *cli_flags(options)]
        self.log_file = log_file
        self.proc = None

    def start(self, timeout: float) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        with open(self.log_file, "ab") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the OpenAI server exited with {self.proc.returncode}{log_tail(self.log_file)}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"the OpenAI server was not ready after {timeout:.0f} s{log_tail(self.log_file)}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # uvicorn's graceful stop; the engine shuts down after it
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        wait_group_gone(self.proc.pid, timeout=5)
        self.proc.wait()


def log_tail(path: Path, chars: int = 3000) -> str:
    return f"; log tail:\n{path.read_text(errors='replace')[-chars:]}" if path.exists() else ""


def triton_server(options: dict, tmp: Path, log_file: Path, sender_threads=None):
    from tritongen.triton.launcher import TritonServer
    from tritongen.triton.repo import write_repository

    repo = write_repository(tmp / "repo", options, sender_threads=sender_threads)
    http, grpc, metrics = free_ports(3)
    return TritonServer(repo, http_port=http, grpc_port=grpc, metrics_port=metrics, log_file=log_file)


# -- the run ----------------------------------------------------------------------------------------

def sessions(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """(server, bench targets) in run order: the OpenAI server, then tritonserver for both Triton
    targets, or one tritonserver each when prefix caching is on."""
    out = [("openai", ["openai"])] if "openai" in args.targets else []
    triton = [TARGETS[t] for t in ("triton", "bls") if t in args.targets]
    if triton:
        out += [("triton", [t]) for t in triton] if args.enable_prefix_caching else [("triton", triton)]
    return out


def run_session(server_kind: str, kinds: list[str], options: dict, tokenizer, requests, warm, args,
                log_dir: Path, tmp: Path) -> list[dict]:
    log_file = log_dir / f"{server_kind}_server.log"
    server = OpenAIServer(options, log_file) if server_kind == "openai" else triton_server(options, tmp, log_file,
                                                                                           args.sender_threads)
    rows = []
    t = time.monotonic()
    log(f"starting the {server_kind} server (log {log_file})")
    try:
        if server_kind == "openai":
            server.start(args.ready_timeout)
            urls, metrics_url = {"openai": server.url}, server.url + "/metrics"
        else:
            server.start()
            server.wait_ready(args.ready_timeout)
            urls = {"triton-grpc": server.grpc_url, "triton-bls": "http://" + server.http_url}
            metrics_url = server.metrics_url
        start_s = time.monotonic() - t
        log(f"{server_kind} server ready in {start_s:.1f} s")
        for kind in kinds:
            try:
                summary = bench_target(kind, urls[kind], tokenizer, requests, warm, args, metrics_url)
                rows.append(row(kind, args, summary, start_s))
            except Exception as exc:  # one target's failure must not cost the others
                log(f"{kind} failed: {type(exc).__name__}: {exc}")
                rows.append(row(kind, args, None, start_s, f"{type(exc).__name__}: {exc}"))
    except Exception as exc:
        log(f"{server_kind} server failed: {type(exc).__name__}: {exc}")
        rows += [row(k, args, None, None, f"server: {type(exc).__name__}: {str(exc)[:2000]}") for k in kinds]
    finally:
        server.stop()
        if server_kind == "triton" and server.process is not None:
            wait_group_gone(server.process.pid)  # the stubs hold the engine's memory
        log(f"{server_kind} server stopped{gpu_memory_used()}")
    return rows


def format_table(rows: list[dict]) -> str:
    head = f"{'target':<12}{'RPS':>8}{'RPM':>8}{'TTFT p50':>10}{'p99':>9}{'TPOT p50':>10}{'p99':>8}" \
           f"{'ITL p50':>9}{'ok/err':>10}{'cli cpu':>8}{'prefill':>9}{'ahead':>7}{'run':>7}{'wait':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['target']:<12}{_f(r['rps'], '.2f'):>8}{_f(r['rpm'], '.0f'):>8}{_f(r['ttft_p50_ms']):>10}"
                     f"{_f(r['ttft_p99_ms']):>9}{_f(r['tpot_p50_ms'], '.2f'):>10}{_f(r['tpot_p99_ms'], '.2f'):>8}"
                     f"{_f(r['itl_p50_ms'], '.2f'):>9}{str(r['num_ok']) + '/' + str(r['num_err']):>10}"
                     f"{_f(r['client_cpu'], '.2f'):>8}{_pct(r.get('prefill_step_share')):>9}"
                     f"{_pct(r.get('ahead_step_share')):>7}{_f(r.get('engine_running')):>7}"
                     f"{_f(r.get('engine_waiting')):>6}")
    base = next((r["rps"] for r in rows if r["target"] == "openai"), None)
    for kind, goal in (("triton-grpc", 0.98), ("triton-bls", 0.95)):
        rps = next((r["rps"] for r in rows if r["target"] == kind), None)
        if base and rps is not None:
            lines.append(f"{kind} / openai RPS: {rps / base:.3f}  (goal >= {goal})")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    options = {k: v for k, v in engine_kwargs(args).items() if v is not None}
    tokenizer, options["tokenizer"] = pick_tokenizer(args)
    requests, warm = make_requests(args, tokenizer)
    tmp = Path(tempfile.mkdtemp(prefix="tritongen-serving-"))
    log_dir = Path(args.log_dir) if args.log_dir else tmp
    log_dir.mkdir(parents=True, exist_ok=True)
    log(f"{args.model} {args.dtype} on {args.device}, tokenizer {options['tokenizer']}; {len(requests)} "
        f"{args.dataset} requests ({sum(r.prompt_len for r in requests)} prompt / "
        f"{sum(r.output_len for r in requests)} output tokens), concurrency {args.concurrency}")
    rows: list[dict] = []
    try:
        for server_kind, kinds in sessions(args):
            rows += run_session(server_kind, kinds, options, tokenizer, requests, warm, args, log_dir, tmp)
            if args.json_out:
                Path(args.json_out).expanduser().write_text(json.dumps(rows, indent=2))
    finally:
        shutil.rmtree(tmp / "repo", ignore_errors=True)
    print(format_table(rows), flush=True)
    log("done")
    return 0 if rows and all(r["num_err"] == 0 and r["rps"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
