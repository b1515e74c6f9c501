"""gpu_suite sections over whole workloads: offline sharegpt-like-1000 against HF continuous
batching, GPU correctness (tests/gpu + bf16-vs-fp32 logits), and serving at concurrency 128
through benchmarks/gpu_serving.py (OpenAI server vs Triton), each with its goals (docs/benchmarks.md).
"""
from __future__ import annotations

import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from tritongen.bench import roofline
from tritongen.bench.datasets import BenchRequest, load_dataset
from tritongen.bench.gpu_suite_common import Row, SuiteContext, free_memory, hf_from_state, ratio, short, sync
from tritongen.bench.gpu_suite_engine import per_model
from tritongen.bench.offline import model_prompts, run_offline
from tritongen.models.loader import read_arch

OFFLINE_FLOOR_GOAL = 0.40
OFFLINE_PEER_GOAL = 10.0
TRITON_STREAM_GOAL = 0.98
TRITON_BLS_GOAL = 0.95
RPS_13B_GOAL = 20.0
TPOT_FLOOR_FACTOR = 2.0
SERVING_FLOOR_BATCH = 128


# -- offline --------------------------------------------------------------------------------------

def _offline_requests(ctx: SuiteContext, llm) -> list[BenchRequest]:
    """The dataset as token ids our model and the peer both accept (folded into a dummy model's
    vocabulary by bench.offline.model_prompts), so both run exactly the same requests."""
    cfg = ctx.cfg
    reqs = load_dataset(cfg.dataset, cfg.num_prompts, cfg.seed, llm.tokenizer)
    out = []
    for ids, r in zip(model_prompts(llm, reqs), reqs):
        ids = ids[:cfg.clip_prompt] if cfg.clip_prompt else ids
        out.append(BenchRequest(ids, len(ids), min(r.output_len, cfg.clip_output or r.output_len)))
    return out


def _padded_generate(hf, reqs: list[BenchRequest], chunk: int = 16) -> dict:
    """Fallback peer: left-padded batched generate in chunks; each chunk runs to its longest
    output, but only each request's own output_len counts as output."""
    import torch

    device = next(hf.parameters()).device
    with torch.no_grad():
        hf.generate(torch.tensor([reqs[0].prompt], device=device), max_new_tokens=2, pad_token_id=0, do_sample=False)
    sync(device)
    t0 = time.perf_counter()
    for i in range(0, len(reqs), chunk):
        part = reqs[i:i + chunk]
        width = max(len(r.prompt) for r in part)
        ids = torch.zeros(len(part), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, r in enumerate(part):
            ids[j, width - len(r.prompt):] = torch.tensor(r.prompt)
            mask[j, width - len(r.prompt):] = 1
        n = max(r.output_len for r in part)
        with torch.no_grad():
            hf.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=n, min_new_tokens=n,
                        pad_token_id=0, do_sample=False)
    sync(device)
    elapsed = time.perf_counter() - t0
    out_tokens = sum(r.output_len for r in reqs)
    return {"num_requests": len(reqs), "elapsed_time": elapsed, "completion_tokens": out_tokens,
            "rps": len(reqs) / elapsed, "output_tok_s": out_tokens / elapsed}


def _offline_peer(ctx: SuiteContext, model: str, subset: list[BenchRequest]) -> dict:
    hf = ctx.hf_peer(model)
    ctx.log(f"offline {model}: HF peer on {len(subset)} requests")
    # Continuous batching runs on transformers' attention interface (paged); Bloom's ALiBi attention is its own.
    if hasattr(hf, "continuous_batching_context_manager") and getattr(type(hf), "_supports_attention_backend", True):
        from tritongen.bench.hf_bench import hf_throughput

        res = hf_throughput(hf, subset, tokenizer=None, attn="paged|sdpa")
        res["method"] = ("transformers continuous batching (the engine behind generate_batch), paged|sdpa, "
                         "each request its own max_new_tokens")
    else:
        res = _padded_generate(hf, subset)
        res["method"] = "padded batched generate, chunks of 16 (no continuous batching for this class here)"
    del hf
    free_memory()
    ctx.log(f"offline {model}: HF {res['output_tok_s']:.1f} out tok/s ({res['method']})")
    return res


def _offline_one(ctx: SuiteContext, model: str) -> tuple[dict, list[Row]]:
    cfg = ctx.cfg
    llm = ctx.engine(model)
    reqs = _offline_requests(ctx, llm)
    subset = reqs[:cfg.peer_subset]
    ctx.log(f"offline {model}: ours on all {len(reqs)} requests, then on the first {len(subset)}")
    ours = run_offline(llm, reqs)
    ours_sub = run_offline(llm, subset, warmup=False)  # no prefix caching: the full run left no hits
    arch, max_batch = llm.engine.runner.arch, llm.config.scheduler.max_num_seqs
    del llm  # the peer needs the engine's memory
    floor = roofline.dataset_floor(arch, cfg.dtype, [(r.prompt_len, r.output_len) for r in reqs], max_batch, ctx.hw)
    floor_sub = roofline.dataset_floor(arch, cfg.dtype, [(r.prompt_len, r.output_len) for r in subset], max_batch,
                                       ctx.hw)
    frac, frac_sub = floor["floor_s"] / ours["elapsed_time"], floor_sub["floor_s"] / ours_sub["elapsed_time"]
    ctx.log(f"offline {model}: ours {ours['rps']:.2f} req/s, {ours['output_tok_s']:.0f} out tok/s, floor "
            f"{floor['floor_s']:.2f} s -> fraction {frac:.3f}; subset {ours_sub['output_tok_s']:.0f} out tok/s")
    peer = _offline_peer(ctx, model, subset) if cfg.peer else None
    peer_tok_s = peer["output_tok_s"] if peer else None
    r = ratio(ours_sub["output_tok_s"], peer_tok_s)
    m, n, k = short(model), len(reqs), len(subset)
    data = {"ours": ours, "ours_subset": ours_sub, "peer_subset": peer, "floor": floor, "fraction": frac,
            "floor_subset": floor_sub, "fraction_subset": frac_sub, "ratio_subset": r, "max_num_seqs": max_batch}
    rows = [Row("offline", f"offline {m} out tok/s ({n} req)", ours=ours["output_tok_s"], fraction=frac,
                unit="tok/s", goal=f"roofline >= {OFFLINE_FLOOR_GOAL}", met=frac >= OFFLINE_FLOOR_GOAL),
            Row("offline", f"offline {m} req/s ({n} req)", ours=ours["rps"], fraction=frac, unit="req/s"),
            Row("offline", f"offline {m} out tok/s ({k}-req subset)", ours=ours_sub["output_tok_s"],
                peer=peer_tok_s, ratio=r, fraction=frac_sub, unit="tok/s", goal=f">= {OFFLINE_PEER_GOAL:g}x peer",
                met=None if r is None else r >= OFFLINE_PEER_GOAL, note=(peer or {}).get("method", "no peer")[:60])]
    return data, rows


def section_offline(ctx: SuiteContext) -> tuple[dict, list[Row]]:
    return per_model(ctx, ctx.cfg.offline_models, _offline_one, "offline")


# -- correctness ----------------------------------------------------------------------------------

def _pytest_counts(text: str) -> dict:
    tail = "\n".join(text.strip().splitlines()[-3:])
    counts = {k: 0 for k in ("passed", "failed", "skipped", "errors", "deselected")}
    for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", tail):
        counts["errors" if word.startswith("error") else word] += int(n)
    return counts


def _run_pytest(ctx: SuiteContext) -> dict:
    cmd = [sys.executable, "-m", "pytest", "tests/gpu", "-q", "-s", "-p", "no:cacheprovider"]
    if ctx.cfg.pytest_k:
        cmd += ["-k", ctx.cfg.pytest_k]
    ctx.log("correctness: " + shlex.join(cmd))
    proc = subprocess.run(cmd, cwd=ctx.root, capture_output=True, text=True, timeout=900)
    log_path = Path(ctx.out_dir) / "gpu_suite_pytest.log"
    log_path.write_text(proc.stdout + proc.stderr)
    tail = proc.stdout.strip().splitlines()[-15:]
    print("\n".join("  | " + line for line in tail), flush=True)
    return {"command": shlex.join(cmd), "returncode": proc.returncode, "log": str(log_path),
            **_pytest_counts(proc.stdout), "tail": tail}


def _prefill_logits(net, ids: list[int], device, backend: str = "reference"):
    """Logits of every prompt position through our model, one sequence in a fresh paged cache."""
    import torch

    from tritongen.ops.attention import build_attention_metadata

    bs, n = 16, len(ids)
    nb = -(-n // bs)
    dtype = next(net.parameters()).dtype
    kv = [torch.zeros(net.kv_cache_shape(nb, bs), dtype=dtype, device=device)
          for _ in range(net.arch.num_hidden_layers)]
    meta = build_attention_metadata([n], [n], [list(range(nb))], bs, device, backend)
    with torch.inference_mode():
        hidden = net(torch.tensor(ids, device=device), torch.arange(n, device=device), kv, meta)
        return net.compute_logits(hidden).float().cpu()


def _copy_model(net, arch, dtype, device):
    from tritongen.models.loader import build_empty_model

    twin = build_empty_model(arch, dtype, device)
    twin.load_state_dict(net.state_dict())
    return twin.eval()


def _logits_one(ctx: SuiteContext, model: str) -> tuple[dict, list[Row]]:
    """Max / mean |logit error| against our float32 CPU reference: fp32 and bf16 on the device,
    and HF's fp32 twin on the device (same weights)."""
    import torch

    from tritongen.models.loader import load_model
    from tritongen.ops.attention import select_attention_backend

    device, cfg = torch.device(ctx.cfg.device), ctx.cfg
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        backend = select_attention_backend("auto", device)
        net, arch = load_model(model, torch.float32, device, seed=cfg.seed)
        rng = random.Random(cfg.seed)  # one generator: 48 different tokens, not one token 48 times
        ids = [rng.randrange(arch.vocab_size) for _ in range(48)]
        ref = _prefill_logits(_copy_model(net, arch, torch.float32, torch.device("cpu")), ids, "cpu")
        got = {"fp32": _prefill_logits(net, ids, device, backend),
               "bf16": _prefill_logits(_copy_model(net, arch, torch.bfloat16, device), ids, device, backend)}
        hf = hf_from_state(net.hf_state_dict(), arch, torch.float32, device)
        with torch.no_grad():
            got["hf_fp32"] = hf(torch.tensor([ids], device=device)).logits[0].float().cpu()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    top2 = ref.topk(2, dim=-1).values
    data = {"attention_backend": backend, "tokens": len(ids), "distinct_tokens": len(set(ids)),
            "ref_mean_abs_logit": float(ref.abs().mean()),
            "ref_top2_gap_median": float((top2[:, 0] - top2[:, 1]).median())}
    for name, x in got.items():
        d = (x - ref).abs()
        data[name] = {"max_abs_err": float(d.max()), "mean_abs_err": float(d.mean()),
                      "argmax_agree": float((x.argmax(-1) == ref.argmax(-1)).float().mean())}
    b = data["bf16"]
    row = Row("correctness", f"bf16 vs fp32 logits {short(model)} max|err|", ours=b["max_abs_err"], unit="abs",
              note=f"mean {b['mean_abs_err']:.2e}, argmax agree {b['argmax_agree']:.2f} (reference top-2 gap median "
                   f"{data['ref_top2_gap_median']:.3f}), "
                   f"fp32 max {data['fp32']['max_abs_err']:.1e}, HF fp32 max {data['hf_fp32']['max_abs_err']:.1e}")
    return data, [row]


def section_correctness(ctx: SuiteContext) -> tuple[dict, list[Row]]:
    ctx.release()  # the tests start their own engines
    py = _run_pytest(ctx)
    ok = py["failed"] == 0 and py["errors"] == 0 and py["returncode"] in (0, 5)
    rows = [Row("correctness", "pytest tests/gpu passed", ours=py["passed"], unit="tests", goal="none fail",
                met=ok, note=f"{py['failed']} failed, {py['errors']} errors, {py['skipped']} skipped")]
    logits, logit_rows = per_model(ctx, ctx.cfg.logits_models, _logits_one, "logits")
    free_memory()
    return {"pytest": py, "logits": logits}, rows + logit_rows


# -- serving --------------------------------------------------------------------------------------

def _serving_goals(row: dict, model: str, openai_rps) -> tuple[str, bool | None, float | None]:
    """(goal text, met, ratio to the OpenAI server) of one gpu_serving.py row's RPS."""
    target, rps = str(row.get("target", "")), row.get("rps")
    goals, met = [], []
    r = None if target == "openai" else ratio(rps, openai_rps)
    if "triton" in target or target.startswith("llm"):
        factor = TRITON_BLS_GOAL if "bls" in target else TRITON_STREAM_GOAL
        goals.append(f">= {factor}x openai")
        met.append(None if r is None else r >= factor)
    if "13b" in model.lower():
        goals.append(f">= {RPS_13B_GOAL:g} RPS")
        met.append(rps is not None and rps >= RPS_13B_GOAL)
    return ", ".join(goals), (None if None in met else all(met)) if met else None, r


def _serving_rows(rows: list[dict], model: str, floor_ms: float) -> list[Row]:
    openai_rps = next((r.get("rps") for r in rows if r.get("target") == "openai"), None)
    out = []
    for r in rows:
        name = f"serve {r.get('target')} {short(model)}"
        goal, met, rr = _serving_goals(r, model, openai_rps)
        out.append(Row("serving", f"{name} RPS", ours=r.get("rps"), peer=None if rr is None else openai_rps,
                       ratio=rr, unit="req/s", goal=goal, met=met,
                       note=f"RPM {r.get('rpm') or 0:.0f}, TTFT p50/p99 {r.get('ttft_p50_ms') or 0:.0f}/"
                            f"{r.get('ttft_p99_ms') or 0:.0f} ms"))
        tpot = r.get("tpot_p50_ms")
        out.append(Row("serving", f"{name} TPOT p50", ours=tpot, fraction=floor_ms / tpot if tpot else None,
                       unit="ms", goal=f"<= {TPOT_FLOOR_FACTOR:g}x b{SERVING_FLOOR_BATCH} floor "
                                       f"({TPOT_FLOOR_FACTOR * floor_ms:.2f} ms)",
                       met=None if tpot is None else tpot <= TPOT_FLOOR_FACTOR * floor_ms,
                       note=f"p99 {r.get('tpot_p99_ms') or 0:.2f} ms"))
    return out


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _run_group(cmd: list[str], cwd: str, timeout: float) -> int:
    """Run cmd in its own process group and return its exit status. On timeout the group gets
    SIGTERM, then 40 s; afterwards whatever is left of the group (servers it started) gets SIGKILL,
    so that nothing outlives it holding the GPU."""
    proc = subprocess.Popen(cmd, cwd=cwd, start_new_session=True)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            pass
    _kill_group(proc.pid, signal.SIGKILL)
    return proc.wait()


def _serving_one(ctx: SuiteContext, model: str) -> tuple[dict, list[Row]]:
    cfg = ctx.cfg
    path = Path(ctx.out_dir) / f"gpu_serving_{short(model)}.json"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, "benchmarks/gpu_serving.py", "--model", model, "--concurrency",
           str(cfg.serving_concurrency), "--num-prompts", str(cfg.serving_num_prompts), "--json-out", str(path)]
    cmd += shlex.split(cfg.serving_args)
    ctx.log("serving: " + shlex.join(cmd))
    returncode = _run_group(cmd, ctx.root, cfg.serving_timeout)
    raw = json.loads(path.read_text()) if path.exists() else []
    rows = raw.get("rows", []) if isinstance(raw, dict) else raw
    if not rows:
        raise RuntimeError(f"gpu_serving.py exited {returncode} and wrote no rows")
    # The floor of the batch-128 decode step at the steps section's context (issue 6, item 2).
    floor = roofline.decode_step_floor(read_arch(model), cfg.dtype, [cfg.step_context] * SERVING_FLOOR_BATCH, ctx.hw)
    floor_ms = floor["floor_s"] * 1e3
    return ({"command": shlex.join(cmd), "returncode": returncode, "rows": rows, "step_floor_ms": floor_ms,
             "floor_context": cfg.step_context}, _serving_rows(rows, model, floor_ms))


def section_serving(ctx: SuiteContext) -> tuple[dict, list[Row]]:
    ctx.release()  # the servers need the whole GPU
    if not (Path(ctx.root) / "benchmarks" / "gpu_serving.py").exists():
        ctx.log("serving: benchmarks/gpu_serving.py not found: skipped")
        return {"skipped": "benchmarks/gpu_serving.py not found"}, [
            Row("serving", "serving (concurrency 128)", note="skipped: benchmarks/gpu_serving.py not found")]
    return per_model(ctx, ctx.cfg.serving_models, _serving_one, "serving")
