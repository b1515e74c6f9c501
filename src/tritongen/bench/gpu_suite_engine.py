"""gpu_suite sections that time our engine in-process: roofline ceilings, batch-1 decode against HF
generate, decode step time at batch 8/32/128, and a torch.profiler look at batch-1 decode steps.

Every section takes the SuiteContext and returns (JSON-able dict, table rows). Fractions are
floor / measured, with floors from bench.roofline on the ceilings measured in this run.
"""
from __future__ import annotations

import random
import time
from typing import Callable

from tritongen.bench import roofline
from tritongen.bench.gpu_suite_common import (Row, SuiteContext, copy_bandwidth, free_memory, gemm_flops,
                                              ratio, short, sync)
from tritongen.bench.offline import fixed_length_params, run_latency
from tritongen.models.loader import read_arch

BS1_GOAL = 0.85


def per_model(ctx: SuiteContext, models, fn: Callable[[SuiteContext, str], tuple[dict, list[Row]]],
              section: str) -> tuple[dict, list[Row]]:
    """fn for each model; a model that fails is recorded and the next one still runs."""
    data, rows = {}, []
    for model in models:
        try:
            data[model], r = fn(ctx, model)
            rows += r
        except Exception as exc:  # noqa: BLE001 - one model's failure must not stop the suite
            import traceback

            ctx.log(f"{section} {model} FAILED: {exc!r}")
            data[model] = {"error": repr(exc), "traceback": traceback.format_exc()[-4000:]}
            rows.append(Row(section, f"{section} {short(model)}", note=f"ERROR {exc!r}"[:120]))
            ctx.release()
            free_memory()
    return data, rows


# -- roofline -------------------------------------------------------------------------------------

def section_roofline(ctx: SuiteContext) -> tuple[dict, list[Row]]:
    cfg = ctx.cfg
    bw = copy_bandwidth(cfg.device, cfg.copy_bytes)
    free_memory()
    flops = gemm_flops(cfg.device, cfg.gemm_n, cfg.gemm_dtype)
    free_memory()
    ctx.hw = roofline.Hardware(bandwidth=bw, flops=flops)
    ctx.hw_source = "measured in this run (roofline section)"
    ctx.log(f"copy bandwidth {bw / 1e12:.3f} TB/s, {cfg.gemm_dtype} GEMM {cfg.gemm_n}^3 {flops / 1e12:.1f} TFLOP/s")
    data = {"copy_bandwidth_Bps": bw, "copy_bytes": cfg.copy_bytes, "gemm_flops": flops, "gemm_n": cfg.gemm_n,
            "gemm_dtype": cfg.gemm_dtype, "previous_h200": {"copy_Bps": roofline.H200_BANDWIDTH,
                                                            "gemm_flops": roofline.H200_FLOPS}}
    rows = [Row("roofline", "copy bandwidth (read+write)", ours=bw / 1e12, unit="TB/s",
                note=f"DESIGN.md: {roofline.H200_BANDWIDTH / 1e12:.2f}"),
            Row("roofline", f"{cfg.gemm_dtype} GEMM {cfg.gemm_n}^3", ours=flops / 1e12, unit="TFLOP/s",
                note=f"DESIGN.md: {roofline.H200_FLOPS / 1e12:.0f}")]
    return data, rows


# -- bs1 ------------------------------------------------------------------------------------------

def _bs1_ours(ctx: SuiteContext, model: str) -> dict:
    cfg = ctx.cfg
    llm = ctx.engine(model)
    lat = run_latency(llm, 1, cfg.bs1_input_len, cfg.bs1_output_len, iters=cfg.iters, warmup_iters=1, seed=cfg.seed)
    rng = random.Random(cfg.seed + 99)
    prompt = [rng.randrange(100, llm.engine.limits.vocab_size) for _ in range(cfg.bs1_input_len)]
    sync(cfg.device)
    t0 = time.perf_counter()
    out = llm.generate([prompt], fixed_length_params(cfg.bs1_output_len))[0]
    e2e = time.perf_counter() - t0
    assert len(out.token_ids) == cfg.bs1_output_len, (len(out.token_ids), cfg.bs1_output_len)
    return {**lat, "e2e_s": e2e, "e2e_tok_s": cfg.bs1_output_len / e2e, "loops": _other_loops(ctx, llm)}


def _other_loops(ctx: SuiteContext, llm) -> dict:
    """Decode ms/step of the engine loops the default one replaced, in the same process: the
    pipelined loop without asynchronous scheduling, and the sequential loop."""
    eng = llm.engine
    if not eng.pipelined:
        return {}
    cfg, saved, out = ctx.cfg, (eng.pipelined, eng.async_scheduling), {}
    try:
        for name, modes in (("pipelined", (True, False)), ("sequential", (False, False))):
            eng.pipelined, eng.async_scheduling = modes
            lat = run_latency(llm, 1, cfg.bs1_input_len, cfg.bs1_output_len, iters=1, warmup_iters=0, seed=cfg.seed)
            out[name] = lat["decode_step_ms"]["mean"]
    finally:
        eng.pipelined, eng.async_scheduling = saved
    ctx.log("bs1 other engine loops, ms/step: " + ", ".join(f"{k} {v:.3f}" for k, v in out.items()))
    return out


def _bs1_one(ctx: SuiteContext, model: str) -> tuple[dict, list[Row]]:
    cfg = ctx.cfg
    ctx.log(f"bs1 {model}: ours {cfg.bs1_input_len} in / {cfg.bs1_output_len} out")
    ours = _bs1_ours(ctx, model)
    step_ms = ours["decode_step_ms"]["mean"]
    floor = roofline.decode_step_floor(read_arch(model), cfg.dtype,
                                       [cfg.bs1_input_len + cfg.bs1_output_len // 2], ctx.hw)
    frac = floor["floor_s"] * 1e3 / step_ms
    ctx.log(f"bs1 {model}: ours {ours['e2e_tok_s']:.1f} tok/s e2e, {step_ms:.3f} ms/step, "
            f"floor {floor['floor_s'] * 1e3:.3f} ms -> fraction {frac:.3f}")
    peer = None
    if cfg.peer:
        from tritongen.bench.hf_bench import hf_latency

        hf = ctx.hf_peer(model)
        ctx.log(f"bs1 {model}: HF generate")
        peer = hf_latency(hf, cfg.bs1_input_len, cfg.bs1_output_len, iters=cfg.iters, seed=cfg.seed)
        del hf
        free_memory()
        ctx.log(f"bs1 {model}: HF {peer['tok_s']:.1f} tok/s")
    peer_tok_s = peer["tok_s"] if peer else None
    data = {"ours": ours, "peer_hf_generate": peer, "floor": floor, "fraction": frac}
    m = short(model)
    rows = [Row("bs1", f"bs1 {m} tok/s ({cfg.bs1_input_len}/{cfg.bs1_output_len}, e2e)", ours=ours["e2e_tok_s"],
                peer=peer_tok_s, ratio=ratio(ours["e2e_tok_s"], peer_tok_s), fraction=frac, unit="tok/s",
                goal=f"roofline >= {BS1_GOAL}", met=frac >= BS1_GOAL),
            Row("bs1", f"bs1 {m} ms/step (decode)", ours=step_ms, peer=peer["ms_per_token"] if peer else None,
                fraction=frac, unit="ms", note=f"floor {floor['floor_s'] * 1e3:.3f} ms")]
    rows += [Row("bs1", f"bs1 {m} ms/step, {name} loop", ours=ms, fraction=floor["floor_s"] * 1e3 / ms, unit="ms",
                 note="same process, async scheduling off" + (", no pipelining" if name == "sequential" else ""))
             for name, ms in ours["loops"].items()]
    return data, rows


def section_bs1(ctx: SuiteContext) -> tuple[dict, list[Row]]:
    return per_model(ctx, ctx.cfg.bs1_models, _bs1_one, "bs1")


# -- steps ----------------------------------------------------------------------------------------

def _steps_one(ctx: SuiteContext, model: str) -> tuple[dict, list[Row]]:
    cfg = ctx.cfg
    llm = ctx.engine(model)
    n = cfg.step_decode_tokens
    input_len = max(1, cfg.step_context - n // 2)  # decode contexts then average step_context
    data, rows = {}, []
    for b in cfg.step_batches:
        lat = run_latency(llm, b, input_len, n, iters=cfg.iters, warmup_iters=1, seed=cfg.seed)
        step_ms = lat["decode_step_ms"]["mean"]
        floor = roofline.decode_step_floor(llm.engine.runner.arch, cfg.dtype, [cfg.step_context] * b, ctx.hw)
        frac = floor["floor_s"] * 1e3 / step_ms
        ctx.log(f"steps {model} batch {b}: {step_ms:.3f} ms/step (p50 {lat['decode_step_ms']['p50']:.3f}), "
                f"floor {floor['floor_s'] * 1e3:.3f} ms ({floor['bound']}) -> fraction {frac:.3f}")
        data[str(b)] = {**lat, "floor": floor, "fraction": frac}
        rows.append(Row("steps", f"step {short(model)} b{b} ctx{cfg.step_context}", ours=step_ms, fraction=frac,
                        unit="ms", note=f"floor {floor['floor_s'] * 1e3:.3f} ms, {lat['decode_tok_s']:.0f} tok/s"))
    return data, rows


def section_steps(ctx: SuiteContext) -> tuple[dict, list[Row]]:
    return per_model(ctx, ctx.cfg.steps_models, _steps_one, "steps")


# -- profile --------------------------------------------------------------------------------------

def _decode_steps(engine, n: int) -> None:
    for _ in range(n):
        engine.step()


def _profile_run(ctx: SuiteContext, engine, n: int):
    """(profiler, wall seconds per step unprofiled, profiled) over n decode steps of one request."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cfg = ctx.cfg
    rng = random.Random(cfg.seed + 7)
    prompt = [rng.randrange(100, engine.limits.vocab_size) for _ in range(cfg.bs1_input_len)]
    engine.add_request("profile", prompt, fixed_length_params(3 * n + 16))
    while engine.has_unfinished() and not any(o.delta_token_ids for o in engine.step()):
        pass  # prefill until the first token
    _decode_steps(engine, 5)
    sync(cfg.device)
    t0 = time.perf_counter()
    _decode_steps(engine, n)
    sync(cfg.device)
    wall = (time.perf_counter() - t0) / n
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.device(cfg.device).type == "cuda" else [])
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        _decode_steps(engine, n)
        sync(cfg.device)
        wall_profiled = (time.perf_counter() - t0) / n
    engine.abort("profile")
    while engine.has_unfinished():
        engine.step()
    return prof, wall, wall_profiled


def _self_us(e, on_gpu: bool) -> float:
    if on_gpu:
        return getattr(e, "self_device_time_total", 0.0) or getattr(e, "device_time_total", 0.0)
    return e.self_cpu_time_total


def _top_kernels(prof, n_steps: int, top: int = 15) -> dict:
    """Top entries, summed time and count per step of GPU kernels (and memcpy/memset) when CUDA
    was traced, else of CPU ops by self time (the smoke run)."""
    from torch.autograd import DeviceType

    events = list(prof.key_averages())
    gpu = [e for e in events if getattr(e, "device_type", None) == DeviceType.CUDA]
    on_gpu = bool(gpu)
    events = gpu or events
    kind = "cuda kernels" if on_gpu else "cpu ops (no CUDA trace)"
    total_us = sum(_self_us(e, on_gpu) for e in events)
    ranked = sorted(events, key=lambda e: _self_us(e, on_gpu), reverse=True)[:top]
    out = []
    for e in ranked:
        us = _self_us(e, on_gpu)
        out.append({"name": e.key[:160], "calls": e.count, "total_ms": us / 1e3, "ms_per_step": us / 1e3 / n_steps,
                    "pct": 100.0 * us / total_us if total_us else 0.0})
    return {"top": out, "ms_per_step": total_us / 1e3 / n_steps, "summed": kind,
            "launches_per_step": sum(e.count for e in events) / n_steps}


def section_profile(ctx: SuiteContext) -> tuple[dict, list[Row]]:
    cfg = ctx.cfg
    model, n = cfg.profile_model, cfg.profile_steps
    llm = ctx.engine(model)
    prof, wall_s, wall_prof_s = _profile_run(ctx, llm.engine, n)
    k = _top_kernels(prof, n)
    top, kernel_ms, kind = k["top"], k["ms_per_step"], k["summed"]
    floor = roofline.decode_step_floor(read_arch(model), cfg.dtype, [cfg.bs1_input_len + n], ctx.hw)
    floor_ms, wall_ms = floor["floor_s"] * 1e3, wall_s * 1e3
    print(f"top {len(top)} {kind} over {n} batch-1 decode steps of {model}:", flush=True)
    for e in top:
        print(f"  {e['ms_per_step']:8.4f} ms/step {e['pct']:5.1f}% x{e['calls']:<5} {e['name'][:90]}", flush=True)
    ctx.log(f"profile {model}: {kind} {kernel_ms:.3f} ms/step ({k['launches_per_step']:.0f} per step) vs wall "
            f"{wall_ms:.3f} ms/step (profiled {wall_prof_s * 1e3:.3f}); floor {floor_ms:.3f} ms")
    data = {"model": model, "steps": n, "summed": kind, "top": top, "kernel_ms_per_step": kernel_ms,
            "launches_per_step": k["launches_per_step"], "wall_ms_per_step": wall_ms,
            "wall_ms_per_step_profiled": wall_prof_s * 1e3, "busy_fraction": kernel_ms / (wall_prof_s * 1e3),
            "floor_ms": floor_ms}
    m = short(model)
    rows = [Row("profile", f"profile {m} bs1 kernel time/step", ours=kernel_ms, fraction=floor_ms / kernel_ms,
                unit="ms", note=kind),
            Row("profile", f"profile {m} bs1 wall time/step", ours=wall_ms, fraction=floor_ms / wall_ms, unit="ms",
                note=f"device busy {100 * data['busy_fraction']:.0f}% of profiled wall")]
    return data, rows
