"""Our engine against a peer engine (vLLM or LMDeploy) on one GPU, same weights, same requests (issue 30).

The dummy model (default dummy:llama-2-7b, bf16) is saved once as an HF safetensors checkpoint
with the tokenizer beside it; both engines load that directory. Workloads:
  bs1      batch-1 decode, 128 prompt ids in / 256 out, through each one's offline LLM.generate
  offline  sharegpt-like-1000 as token ids (the same ids, output lengths, ignore_eos) in one generate
  serving  the same requests as text through each one's OpenAI server at concurrency 128, with our
           load generator (bench.loadgen, the `tritongen bench serve` path)
FP8: `--quantization fp8 --vllm-kwargs '{"quantization": "fp8"}'` (both quantize the bf16
checkpoint at load; add `--kv-cache-dtype fp8` and vLLM's "kv_cache_dtype" for the cache); the
floors then count FP8 weight (and KV) bytes. Greedy everywhere, prefix caching off on both. Every
engine runs in its own process (a worker process for bs1 + offline, a server process for serving,
started on a free 127.0.0.1 port and stopped by PID), one at a time: each takes most of the GPU.
Prints ours/peer ratios with the roofline fraction (floors from the copy bandwidth and GEMM rate
each worker measures on the GPU; DESIGN.md's H200 ceilings on the CPU) and writes JSON.

GPU machine, the peer installed from the carried parts (benchmarks/peers/install_vllm.sh, or
install_lmdeploy.sh with /tmp/peer-site-lmdeploy and --peer lmdeploy: its PyTorch engine):
    PYTHONPATH=/tmp/peer-site:$PWD/src TRITONGEN_LLAMA2_TOKENIZER=<dir> python3 benchmarks/peer_suite.py \
        --peer vllm [--workloads bs1,offline] [--sides ours,peer]
A device command runs at most 10 minutes: split the work with --workloads / --sides over calls on
one warm machine. The checkpoint (--checkpoint-dir) and the results so far (--state) stay in /tmp
between those calls while the machine is warm; each call says whether it found them, and the table
covers every result in the state.
Here, on CPU, our side end to end (the peer needs the GPU machine):
    python benchmarks/peer_suite.py --peer none --model dummy:tiny-llama --device cpu --num-prompts 16 \
        --concurrency 4 --bs1-input-len 16 --bs1-output-len 8 --kv-cache-memory-gb 0.05 --state /tmp/ps.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

import gpu_serving  # noqa: E402  (benchmarks/: its server lifecycle and load runs)

from tritongen.bench import peers  # noqa: E402
from tritongen.config import CacheConfig  # noqa: E402
from tritongen.config_cli import add_engine_args, engine_kwargs  # noqa: E402

WORKLOADS = ("bs1", "offline", "serving")
# The GPU machine has no network: nothing should wait on a hub or a usage-stats endpoint.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
log = gpu_serving.log


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", choices=[*peers.PEERS, "none"], default="vllm", help="none: our side only")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="any of " + ", ".join(WORKLOADS))
    ap.add_argument("--sides", default="ours,peer", help="ours, peer or both (split the work over calls)")
    ap.add_argument("--checkpoint-dir", default=None, help="default /tmp/peer-ckpt/<preset>-<dtype>-s<seed>")
    ap.add_argument("--state", default="/tmp/peer-results/peer_suite.json",
                    help="results kept across calls on a warm machine (merged by side and workload)")
    ap.add_argument("--json-out", default=None, help="default $OUT/peer_suite.json, else out/peer_suite.json")
    ap.add_argument("--bs1-input-len", type=int, default=128)
    ap.add_argument("--bs1-output-len", type=int, default=256)
    ap.add_argument("--bs1-iters", type=int, default=3, help="timed requests after one warm-up")
    ap.add_argument("--num-prompts", type=int, default=1000, help="offline and serving requests")
    ap.add_argument("--dataset", default="sharegpt-like", help="as `tritongen bench serve --dataset`")
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--warmup-prompts", type=int, default=None, help="serving warm-up (default: the concurrency)")
    ap.add_argument("--max-duration", type=float, default=240.0, help="serving: seconds after which none is sent")
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--ready-timeout", type=float, default=420.0, help="seconds a server may take to start")
    ap.add_argument("--worker-timeout", type=float, default=540.0, help="seconds for one side's bs1 + offline")
    ap.add_argument("--vllm-kwargs", type=json.loads, default={},
                    help='extra vllm.LLM arguments as JSON, also its server\'s flags, e.g. {"max_num_seqs": 256}')
    ap.add_argument("--lmdeploy-kwargs", type=json.loads, default={},
                    help='extra PytorchEngineConfig fields as JSON, also its server\'s flags, '
                         'e.g. {"max_batch_size": 256}')
    ap.add_argument("--log-dir", default=None, help="server logs and the worker plan (default: beside the JSON)")
    add_engine_args(ap)  # ours: --model, --tokenizer, --dtype, --device, --max-num-seqs, ...
    ap.set_defaults(model="dummy:llama-2-7b", dtype=None, enable_prefix_caching=False)
    args = ap.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if gpu_serving.on_gpu(args.device) else "float32")
    args.workloads = [w for w in WORKLOADS if w in {x.strip() for x in args.workloads.split(",")}]
    sides = {x.strip() for x in args.sides.split(",")}
    args.sides = (["tritongen"] if "ours" in sides else []) + ([args.peer] if "peer" in sides and args.peer != "none"
                                                               else [])
    if not args.workloads or not args.sides:
        ap.error("nothing to run: check --workloads and --sides (--peer none leaves only ours)")
    return args


def settings(args: argparse.Namespace, options: dict) -> dict:
    """What a result depends on: state from a call with other settings is not merged."""
    keys = ("model", "dtype", "seed", "dataset", "num_prompts", "concurrency", "bs1_input_len", "bs1_output_len",
            "bs1_iters", "vllm_kwargs", "lmdeploy_kwargs", "max_duration")
    return {**{k: getattr(args, k) for k in keys}, "ours_options": options}


def out_paths(args: argparse.Namespace) -> tuple[Path, Path]:
    json_out = Path(args.json_out or (Path(os.environ["OUT"]) / "peer_suite.json" if os.environ.get("OUT")
                                      else ROOT / "out" / "peer_suite.json")).expanduser()
    log_dir = Path(args.log_dir).expanduser() if args.log_dir else json_out.parent
    json_out.parent.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    return json_out, log_dir


def load_state(path: Path, want: dict) -> dict:
    if not path.exists():
        log(f"state {path}: none (a fresh machine, or the first call)")
        return {"settings": want, "runs": {}}
    state = json.loads(path.read_text())
    if state.get("settings") != want:
        log(f"state {path}: from other settings, not merged")
        return {"settings": want, "runs": {}}
    done = [f"{s}/{w}" for s, ws in state["runs"].items() for w in ws if w in WORKLOADS]
    log(f"state {path}: results of earlier calls on this warm machine: {', '.join(done) or 'none'}")
    return state


# -- worker processes -------------------------------------------------------------------------------

def worker_main(argv: list[str]) -> int:
    """`--worker save|<side> PLAN RESULT`: one job in this process, its result as JSON."""
    kind, plan_path, result_path = argv
    plan = json.loads(Path(plan_path).read_text())
    if kind == "save":
        result = peers.save_checkpoint(plan["model"], Path(plan["model_dir"]), plan["tokenizer_dir"], plan["dtype"],
                                       plan["device"], plan["seed"])
    else:
        result = peers.run_worker(kind, plan)
    Path(result_path).write_text(json.dumps(result, indent=1))
    return 0


def run_worker(kind: str, plan: dict, log_dir: Path, timeout: float) -> dict:
    plan_path, result_path = log_dir / f"peer_plan_{kind}.json", log_dir / f"peer_result_{kind}.json"
    plan_path.write_text(json.dumps(plan))
    result_path.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, str(plan_path), str(result_path)]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log(f"worker {kind}: still running after {timeout:.0f} s, stopped")
        gpu_serving.wait_group_gone(proc.pid, timeout=0)
        proc.wait()
    gpu_serving.wait_group_gone(proc.pid)  # helper processes left behind hold GPU memory the next one needs
    if proc.returncode != 0 or not result_path.exists():
        raise RuntimeError(f"worker {kind} exited with {proc.returncode}")
    return json.loads(result_path.read_text())


def checkpoint(args: argparse.Namespace, tokenizer_dir: str, log_dir: Path) -> tuple[str, dict]:
    from tritongen.models.loader import is_dummy

    if not is_dummy(args.model):
        return args.model, {"model_dir": args.model, "reused": True, "note": "an HF directory, used as it is"}
    preset = args.model.split(":", 1)[1]
    model_dir = args.checkpoint_dir or f"/tmp/peer-ckpt/{preset}-{args.dtype}-s{args.seed}"
    plan = {"model": args.model, "model_dir": model_dir, "tokenizer_dir": tokenizer_dir, "dtype": args.dtype,
            "device": args.device, "seed": args.seed}
    info = run_worker("save", plan, log_dir, timeout=args.worker_timeout)
    log(f"checkpoint {model_dir}: " + ("found from an earlier call on this warm machine" if info["reused"] else
                                       f"written in {info['seconds']:.0f} s ({info['bytes'] / 1e9:.2f} GB)"))
    return model_dir, info


# -- serving ----------------------------------------------------------------------------------------

def server_command(side: str, model_dir: str, port: int, options: dict, args) -> list[str]:
    if side == "tritongen":
        return peers.OursSide.server_command(model_dir, port, options)
    if side == "lmdeploy":
        return peers.LmdeploySide.server_command(model_dir, port, args.dtype, args.lmdeploy_kwargs)
    return peers.VllmSide.server_command(model_dir, port, args.dtype, args.seed, args.vllm_kwargs)


def serve_one(side: str, model_dir: str, options: dict, args, tokenizer, requests, warm, log_dir: Path) -> dict:
    """One side's OpenAI server: started, warmed, measured, stopped; a gpu_serving row."""
    server = gpu_serving.OpenAIServer({}, log_dir / f"{side}_server.log")
    server.cmd = server_command(side, model_dir, server.port, options, args)
    t0 = time.monotonic()
    log(f"serving {side}: starting {' '.join(server.cmd[:4])} ... on port {server.port}")
    try:
        server.start(args.ready_timeout)
        start_s = time.monotonic() - t0
        log(f"serving {side}: ready in {start_s:.1f} s")
        if warm:
            s = gpu_serving.run_load("openai", server.url, tokenizer, warm, args)
            log(f"serving {side}: warm-up {s['completed']}/{len(warm)} ok")
        # The gauges under vLLM's names, which both servers export (None where a server exports none:
        # LMDeploy by default); the step mix from our engine only.
        s = gpu_serving.measured_load("openai", server.url, tokenizer, requests, args, server.url + "/metrics",
                                      gpu_serving.PEER_GAUGE_SERIES, engine_steps=side == "tritongen",
                                      server_pid=server.proc.pid)
        log(f"serving {side}: requests in the engine {gpu_serving._f(s.get('engine_running'))} running, "
            f"{gpu_serving._f(s.get('engine_waiting'))} waiting (mean); steps with prompt tokens "
            f"{gpu_serving._pct(s.get('prefill_step_share'))} ({gpu_serving._pct(s.get('mixed_graph_share'))} of "
            f"them replayed a CUDA graph), {gpu_serving._f(s.get('prefill_step_ms'), '.2f')} ms "
            f"against {gpu_serving._f(s.get('decode_step_ms'), '.2f')} ms without, "
            f"{gpu_serving._pct(s.get('ahead_step_share'))} of all launched ahead; the server process "
            f"{gpu_serving._f(s.get('server_cpu'), '.2f')} CPU-s/s, "
            f"{gpu_serving._f(s.get('server_cpu_us_per_token'), '.0f')} us per output token")
        return gpu_serving.row(side, args, s, start_s)
    except Exception as exc:  # noqa: BLE001 - the other side still runs
        log(f"serving {side} FAILED: {type(exc).__name__}: {exc}")
        return gpu_serving.row(side, args, None, None, f"{type(exc).__name__}: {str(exc)[:2000]}")
    finally:
        server.stop()
        log(f"serving {side}: server stopped{gpu_serving.gpu_memory_used()}")


# -- the table --------------------------------------------------------------------------------------

def rows(state: dict, peer: str, arch, args, pairs: list[tuple[int, int]]) -> list:
    """The table; floors from the ceilings our worker measured on this GPU (DESIGN.md's H200 ones
    where no worker has run), the offline one over the dataset's (prompt, output) length pairs."""
    from tritongen.bench import roofline
    from tritongen.bench.gpu_suite_common import Row, ratio

    runs = state["runs"]
    ours, other = runs.get("tritongen", {}), runs.get(peer, {})
    get = lambda run, w, k: (run.get(w) or {}).get(k)  # noqa: E731
    hw = roofline.Hardware(**(ours.get("ceilings") or other.get("ceilings") or {}))
    state["hardware"] = {"bandwidth": hw.bandwidth, "flops": hw.flops}
    out = []
    # Our options' weight and KV bytes (--quantization, --kv-cache-dtype): pass the peer the same ones.
    quant = args.quantization
    kv = "fp8" if CacheConfig(kv_cache_dtype=args.kv_cache_dtype).fp8_kv_cache else None
    floor_ms = 1e3 * roofline.decode_step_floor(arch, args.dtype, [args.bs1_input_len + args.bs1_output_len // 2],
                                                hw, quant, kv)["floor_s"]
    frac = lambda ms: floor_ms / ms if ms else None  # noqa: E731
    fa, fb = frac(get(ours, "bs1", "decode_ms_per_step")), frac(get(other, "bs1", "decode_ms_per_step"))
    for key, name, unit in (("tok_s", "bs1 tok/s (e2e)", "tok/s"), ("decode_ms_per_step", "bs1 decode ms/step", "ms")):
        a, b = get(ours, "bs1", key), get(other, "bs1", key)
        out.append(Row("bs1", f"{name} {args.bs1_input_len}/{args.bs1_output_len}", ours=a, peer=b, ratio=ratio(a, b),
                       fraction=fa, unit=unit, note=f"floor {floor_ms:.3f} ms/step; peer fraction {_f(fb)}"))
    # Each side's floor at its own batch limit: fewer sequences per step means more weight reads.
    batch = {side: (run.get("config") or {}).get("max_num_seqs") or 256 for side, run in (("ours", ours), ("peer", other))}
    floors = {side: roofline.dataset_floor(arch, args.dtype, pairs, b, hw, quant, kv)["floor_s"]
              for side, b in batch.items()}
    state["offline_floor_s"] = floors["ours"]
    state["offline_floors"] = {"ours": {"max_batch": batch["ours"], "floor_s": floors["ours"]},
                               "peer": {"max_batch": batch["peer"], "floor_s": floors["peer"]}}
    for key, unit in (("rps", "req/s"), ("output_tok_s", "tok/s")):
        a, b = get(ours, "offline", key), get(other, "offline", key)
        fa = floors["ours"] / get(ours, "offline", "elapsed_time") if floors["ours"] and a else None
        fb = floors["peer"] / get(other, "offline", "elapsed_time") if floors["peer"] and b else None
        out.append(Row("offline", f"offline {args.dataset}-{args.num_prompts} {key}", ours=a, peer=b,
                       ratio=ratio(a, b), fraction=fa, unit=unit,
                       note=f"floor {_f(floors['ours'])} s (max batch {batch['ours']}); peer fraction {_f(fb)} "
                            f"of {_f(floors['peer'])} s (max batch {batch['peer']})"))
    for key, unit in (("rps", "req/s"), ("output_tok_s", "tok/s"), ("ttft_p50_ms", "ms"), ("tpot_p50_ms", "ms"),
                      ("itl_p50_ms", "ms"), ("engine_running", "seqs"), ("server_cpu_us_per_token", "us")):
        a, b = get(ours, "serving", key), get(other, "serving", key)
        out.append(Row("serving", f"serving c{args.concurrency} {key}", ours=a, peer=b, ratio=ratio(a, b), unit=unit,
                       note=f"ok/err ours {get(ours, 'serving', 'num_ok')}/{get(ours, 'serving', 'num_err')}, "
                            f"peer {get(other, 'serving', 'num_ok')}/{get(other, 'serving', 'num_err')}"))
    return out


def _f(v) -> str:
    return "-" if v is None else f"{v:.3g}"


# -- the run ----------------------------------------------------------------------------------------

def offline_inputs(tokenizer, requests: list, vocab: int) -> tuple[list[list[int]], list[int]]:
    """The serving requests as the token ids both engines get offline (the checkpoint's tokenizer)."""
    prompts = [list(r.prompt) if isinstance(r.prompt, list) else list(tokenizer.encode(r.prompt)) for r in requests]
    if any(t >= vocab for p in prompts for t in p):
        raise SystemExit(f"the tokenizer gives ids beyond the model's {vocab}: pass a tokenizer that fits")
    return prompts, [r.output_len for r in requests]


def run_side(side: str, plan: dict, model_dir: str, options: dict, args, tokenizer, requests, warm,
             log_dir: Path, state: dict, state_path: Path) -> None:
    """One side's workloads; each result goes into the state as soon as it is there."""
    run = state["runs"].setdefault(side, {})
    inproc = [w for w in ("bs1", "offline") if w in args.workloads]
    if inproc:
        log(f"{side}: {', '.join(inproc)} in a worker process")
        try:
            res = run_worker(side, {**plan, "workloads": inproc}, log_dir, args.worker_timeout)
            run.update({w: res[w] for w in inproc}, config=res["config"], env=res["env"], start_s=res["start_s"],
                       **({"ceilings": res["ceilings"]} if "ceilings" in res else {}))  # this GPU's floors
        except Exception as exc:  # noqa: BLE001 - recorded; the serving run still goes
            log(f"{side} worker FAILED: {type(exc).__name__}: {exc}")
            run.update({w: {"error": f"{type(exc).__name__}: {exc}"} for w in inproc})
        save(state_path, state)
    if "serving" in args.workloads:
        run["serving"] = serve_one(side, model_dir, options, args, tokenizer, requests, warm, log_dir)
        save(state_path, state)


def save(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker_main(argv[1:])
    args = parse_args(argv)
    for name, value in OFFLINE_ENV.items():  # the workers and servers inherit them
        os.environ.setdefault(name, value)
    if args.peer in args.sides:
        peers.check_available(args.peer)  # before minutes of checkpoint writing
    from tritongen.bench.gpu_suite_common import format_table
    from tritongen.models.loader import read_arch
    from tritongen.tokenizer import load_tokenizer

    options = {k: v for k, v in engine_kwargs(args).items() if v is not None and k not in ("model", "tokenizer")}
    json_out, log_dir = out_paths(args)
    state_path = Path(args.state).expanduser()
    _, tokenizer_dir = gpu_serving.pick_tokenizer(args)
    model_dir, ckpt = checkpoint(args, tokenizer_dir, log_dir)
    tokenizer = load_tokenizer(model_dir)
    state = load_state(state_path, settings(args, options))
    requests, warm = gpu_serving.make_requests(args, tokenizer)
    arch = read_arch(model_dir)
    prompts, output_lens = offline_inputs(tokenizer, requests, arch.vocab_size)
    plan = {"model_dir": model_dir, "ours_options": options, "dtype": args.dtype, "seed": args.seed,
            "vllm_kwargs": args.vllm_kwargs, "lmdeploy_kwargs": args.lmdeploy_kwargs,
            "bs1_output_len": args.bs1_output_len,
            "bs1_prompts": peers.bs1_prompts(arch.vocab_size, args.bs1_input_len, args.bs1_iters + 1, args.seed),
            "offline_prompts": prompts, "offline_output_lens": output_lens}
    log(f"{args.model} {args.dtype} from {model_dir}; sides {', '.join(args.sides)}; workloads "
        f"{', '.join(args.workloads)}; {len(requests)} {args.dataset} requests ({sum(map(len, prompts))} prompt / "
        f"{sum(output_lens)} output tokens), concurrency {args.concurrency}")
    for side in args.sides:
        run_side(side, plan, model_dir, options, args, tokenizer, requests, warm, log_dir, state, state_path)
    table = rows(state, args.peer, arch, args, list(zip(map(len, prompts), output_lens)))
    save(json_out, {**state, "checkpoint": ckpt, "rows": [asdict(r) for r in table], "argv": sys.argv})
    print(format_table(table), flush=True)
    log(f"JSON {json_out} (state {state_path})")
    failed = [f"{s}/{w}" for s, run in state["runs"].items() for w in WORKLOADS
              if isinstance(run.get(w), dict) and (run[w].get("error") or run[w].get("num_err"))]
    if failed:
        log(f"with errors: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
