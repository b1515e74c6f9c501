"""In-process engine benchmarks: `bench offline` (dataset throughput) and `bench latency`
(per-step decode latency at a fixed batch)."""
from __future__ import annotations

import random
import time

from tritongen.bench.datasets import BenchRequest
from tritongen.bench.results import stats_ms
from tritongen.types import SamplingParams


def fixed_length_params(output_len: int) -> SamplingParams:
    """Greedy, exactly output_len tokens whatever the model writes."""
    return SamplingParams(temperature=0.0, max_tokens=output_len, min_tokens=output_len, ignore_eos=True)


def model_prompts(llm, requests: list[BenchRequest]) -> list[list[int]]:
    """Token ids the model accepts. A dummy model of a real shape may have a smaller vocabulary
    than the tokenizer it borrows (Llama-2: 32k vs the default model's 49k): its ids are folded
    into range, which keeps every prompt's length, all that random weights need. Ids of a real
    model's own tokenizer are always in range, so they pass unchanged."""
    vocab = llm.engine.limits.vocab_size
    out = []
    for r in requests:
        ids = list(r.prompt) if isinstance(r.prompt, list) else list(llm.tokenizer.encode(r.prompt))
        out.append([t % vocab for t in ids] if ids and max(ids) >= vocab else ids)
    return out


def run_offline(llm, requests: list[BenchRequest], warmup: bool = True) -> dict:
    """Every request through LLM.generate at once; throughput of the whole batch."""
    if warmup:
        llm.generate([[1, 2, 3, 4]], fixed_length_params(2))
    prompts = model_prompts(llm, requests)
    params = [fixed_length_params(r.output_len) for r in requests]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    prompt_tokens = sum(o.num_prompt_tokens for o in outs)
    output_tokens = sum(o.num_output_tokens for o in outs)
    return {
        "num_requests": len(requests),
        "elapsed_time": elapsed,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": output_tokens,
        "rps": len(requests) / elapsed,
        "output_tok_s": output_tokens / elapsed,
        "total_tok_s": (prompt_tokens + output_tokens) / elapsed,
        "prefix_cache_hit_rate": llm.stats().get("prefix_cache_hit_rate"),
    }


def format_offline(s: dict) -> str:
    lines = ["=" * 20 + " tritongen bench offline " + "=" * 20]
    for key in ("model", "dataset", "num_requests"):
        if key in s:
            lines.append(f"{key:<32}{s[key]}")
    lines += [
        f"{'elapsed_time':<32}{s['elapsed_time']:.2f} s",
        f"{'number of prompt tokens':<32}{s['prompt_tokens']}",
        f"{'number of completion tokens':<32}{s['completion_tokens']}",
        f"{'requests/s':<32}{s['rps']:.3f}",
        f"{'output tok/s':<32}{s['output_tok_s']:.1f}",
        f"{'total tok/s':<32}{s['total_tok_s']:.1f}",
    ]
    if s.get("roofline"):
        r = s["roofline"]
        lines.append(f"{'roofline floor':<32}{r['floor_s']:.3f} s  (achieved fraction {r['fraction']:.3f})")
    return "\n".join(lines)


def _random_prompts(batch: int, input_len: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(input_len)] for _ in range(batch)]


def _one_latency_run(engine, prompts: list[list[int]], output_len: int, tag: str) -> tuple[float, list[float]]:
    """(prefill seconds, decode step seconds) of one batch run step by step."""
    params = fixed_length_params(output_len)
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts):
        engine.add_request(rid, p, params)
    started: set[str] = set()
    t0 = time.perf_counter()
    prefill, steps = None, []
    while engine.has_unfinished():
        s0 = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - s0
        if prefill is None:
            started.update(o.request_id for o in outs if o.delta_token_ids)
            if len(started) == len(ids):
                prefill = time.perf_counter() - t0  # every request has its first token
        elif any(o.delta_token_ids for o in outs):
            steps.append(dt)
    return prefill or 0.0, steps


def run_latency(llm, batch: int, input_len: int, output_len: int, iters: int = 3, warmup_iters: int = 1,
                seed: int = 0) -> dict:
    """Per-step decode latency of `batch` sequences (prefill excluded), over `iters` runs."""
    engine = llm.engine
    vocab = engine.limits.vocab_size
    prefills, steps = [], []
    for it in range(warmup_iters + iters):
        prompts = _random_prompts(batch, input_len, vocab, seed + it)  # fresh prompts: no prefix-cache hits
        prefill, decode = _one_latency_run(engine, prompts, output_len, f"lat{it}")
        if it >= warmup_iters:
            prefills.append(prefill)
            steps.extend(decode)
    step = stats_ms(steps)
    mean_s = (step["mean"] or 0.0) / 1000.0
    return {
        "batch_size": batch, "input_len": input_len, "output_len": output_len, "iters": iters,
        "decode_step_ms": step,
        "prefill_ms": stats_ms(prefills)["mean"],
        "decode_tok_s": batch / mean_s if mean_s else None,
    }


def format_latency(s: dict) -> str:
    st = s["decode_step_ms"]
    lines = ["=" * 20 + " tritongen bench latency " + "=" * 20]
    for key in ("model", "batch_size", "input_len", "output_len", "iters"):
        if key in s:
            lines.append(f"{key:<32}{s[key]}")
    lines.append(f"{'prefill (ms, mean)':<32}{s['prefill_ms']:.2f}")
    lines.append("decode step (ms)  " + "  ".join(f"{k} {st[k]:.3f}" for k in ("mean", "p50", "p90", "p99")))
    lines.append(f"{'decode tok/s':<32}{s['decode_tok_s']:.1f}")
    if s.get("roofline"):
        r = s["roofline"]
        lines.append(f"{'roofline step floor':<32}{r['floor_ms']:.3f} ms  (achieved fraction {r['fraction']:.3f})")
    return "\n".join(lines)
