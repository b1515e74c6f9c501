"""`eval parity`: our engine against HF transformers on the same weights, greedy, token by token;
or (`against="bf16"`) a quantized engine (`quantization="fp8"`) against the same engine unquantized.

HF runs with eager attention (the arithmetic our reference ops reproduce). For `dummy:` presets the
HF model is a twin holding the engine's own random weights (models.hf_twin); HF directories are
loaded with from_pretrained. Both stop at the model's EOS.
Reported: token match (tokens of the common prefix over the longer output, summed over prompts),
sequences identical, first divergence position, max |Δ logprob| of the chosen tokens on the
common prefix, and ROUGE-1/2/L/Lsum F1 (x100) of our text against HF's.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from tritongen.jsonl import read_lines

BUILTIN_PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about autumn leaves.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers.",
    "Who wrote Romeo and Juliet?",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 12?",
    "Give me a tip for learning to code.",
]


def load_prompts(spec: str) -> list[str]:
    """`builtin`, a .jsonl file of {"prompt": ...}, or a text file with one prompt per line."""
    if spec == "builtin":
        return list(BUILTIN_PROMPTS)
    path = Path(spec).expanduser()
    lines = [line for line in read_lines(path) if line.strip()]
    if path.suffix == ".jsonl":
        import json

        return [json.loads(line)["prompt"] for line in lines]
    return lines


def _hf_model(llm, model: str):
    import transformers

    from tritongen.models.hf_twin import hf_twin
    from tritongen.models.loader import is_dummy

    runner = getattr(llm.engine.runner, "runner", llm.engine.runner)  # rank 0's under tensor parallelism
    if is_dummy(model):
        net = runner.model
        if runner.shard is not None and runner.shard.world_size > 1:  # the twin needs the whole model
            from tritongen.models.loader import load_model

            net, _ = load_model(model, runner.dtype, runner.device, seed=llm.config.model.seed)
        return hf_twin(net, runner.arch, attn_implementation="eager")
    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=runner.dtype, attn_implementation="eager")
    return hf.to(runner.device).eval() if runner.device.type != "cpu" else hf.eval()


def _prompt_ids(tokenizer, prompts: list[str], chat: bool) -> list[list[int]]:
    from tritongen.tokenizer import chat_prompt_ids

    if chat and getattr(tokenizer, "chat_template", None):
        return [chat_prompt_ids(tokenizer, [{"role": "user", "content": p}]) for p in prompts]
    return [tokenizer.encode(p, add_special_tokens=False) for p in prompts]


def compare(ours: list[int], our_lps: list[float], theirs: list[int], their_lps: list[float]) -> dict:
    """Token agreement of one prompt's two outputs."""
    common = 0
    while common < min(len(ours), len(theirs)) and ours[common] == theirs[common]:
        common += 1
    identical = ours == theirs
    deltas = [abs(a - b) for a, b in zip(our_lps[:common], their_lps[:common])]
    return {"matched": common, "total": max(len(ours), len(theirs)), "identical": identical,
            "first_divergence": None if identical else common, "max_abs_dlogprob": max(deltas, default=0.0),
            "sum_abs_dlogprob": sum(deltas), "num_dlogprob": len(deltas)}


def rouge(ours: list[str], theirs: list[str]) -> dict[str, float]:
    """Mean ROUGE F1 x100 of each of our texts against HF's (two empty texts count as identical)."""
    from rouge_score import rouge_scorer

    keys = ("rouge1", "rouge2", "rougeL", "rougeLsum")
    scorer = rouge_scorer.RougeScorer(list(keys), use_stemmer=False)
    totals = dict.fromkeys(keys, 0.0)
    for a, b in zip(ours, theirs):
        if a.strip() == b.strip():
            for k in keys:
                totals[k] += 100.0
            continue
        scores = scorer.score(b, a)  # (target, prediction)
        for k in keys:
            totals[k] += 100.0 * scores[k].fmeasure
    return {k: v / max(len(ours), 1) for k, v in totals.items()}


AGAINST = ("hf", "bf16")


def run_parity(model: str, prompts: list[str], max_tokens: int = 64, chat: bool = True, against: str = "hf",
               **engine_kwargs) -> dict:
    """Greedy outputs of our engine (engine_kwargs) against the reference `against`: "hf" (HF
    transformers on the same weights) or "bf16" (our engine with the same options, unquantized)."""
    from tritongen import LLM, SamplingParams
    from tritongen.fetch import resolve_model
    from tritongen.models.hf_twin import hf_greedy

    if against not in AGAINST:
        raise ValueError(f"against must be one of {AGAINST}, got {against!r}")
    if against == "bf16" and not engine_kwargs.get("quantization"):
        raise ValueError("eval parity --against bf16 compares a quantized engine: pass --quantization")
    if against == "hf" and engine_kwargs.get("quantization"):
        raise ValueError("eval parity of a --quantization engine runs --against bf16 (HF has no twin of it)")
    model = resolve_model(model)
    llm = LLM(model, **engine_kwargs)
    tok = llm.tokenizer
    ids = _prompt_ids(tok, prompts, chat)
    eos = list(llm.engine.limits.eos_token_ids)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=0)
    outs = [(o.token_ids, [lp.logprob for lp in o.logprobs or []]) for o in llm.generate(ids, params)]
    dtype = str(getattr(llm.engine.runner, "runner", llm.engine.runner).dtype).replace("torch.", "")
    if against == "hf":
        hf = _hf_model(llm, model)
        refs = [hf_greedy(hf, p, max_tokens, eos_token_id=eos or None) for p in ids]
        llm.shutdown()
    else:
        llm.shutdown()  # one engine at a time: each sizes its KV cache from the free memory
        ref = LLM(model, **{**engine_kwargs, "quantization": None, "quantize_lm_head": False})
        refs = [(o.token_ids, [lp.logprob for lp in o.logprobs or []]) for o in ref.generate(ids, params)]
        ref.shutdown()
        dtype += f" {engine_kwargs['quantization']}" + (" + lm_head" if engine_kwargs.get("quantize_lm_head") else "")
    per_prompt, ours_text, ref_text = [], [], []
    for (our_ids, our_lps), (ref_ids, ref_lps) in zip(outs, refs):
        per_prompt.append(compare(our_ids, our_lps, ref_ids, ref_lps))
        ours_text.append(tok.decode(our_ids, skip_special_tokens=True))
        ref_text.append(tok.decode(ref_ids, skip_special_tokens=True))
    return {**summarize_parity(model, dtype, max_tokens, per_prompt, ours_text, ref_text), "against": against}


def summarize_parity(model: str, dtype: str, max_tokens: int, rows: list[dict], ours: list[str],
                     theirs: list[str]) -> dict:
    matched, total = sum(r["matched"] for r in rows), sum(r["total"] for r in rows)
    divergences = [(i, r["first_divergence"]) for i, r in enumerate(rows) if r["first_divergence"] is not None]
    return {
        "model": model, "dtype": dtype, "num_prompts": len(rows), "max_tokens": max_tokens,
        "token_match": 100.0 * matched / total if total else 100.0,
        "matched_tokens": matched, "total_tokens": total,
        "identical_sequences": sum(r["identical"] for r in rows),
        "first_divergence": None if not divergences else {"prompt": divergences[0][0], "position": divergences[0][1]},
        "max_abs_dlogprob": max((r["max_abs_dlogprob"] for r in rows), default=0.0),
        "mean_abs_dlogprob": (sum(r.get("sum_abs_dlogprob", 0.0) for r in rows)
                              / max(sum(r.get("num_dlogprob", 0) for r in rows), 1)),
        "rouge": rouge(ours, theirs),
        "per_prompt": [{**r, "ours": a, "hf": b} for r, a, b in zip(rows, ours, theirs)],
    }


def format_parity(s: dict) -> str:
    div = s["first_divergence"]
    r = s["rouge"]
    return "\n".join([
        f"eval parity: {s['model']} ({s['dtype']}) against {s.get('against', 'hf')}, {s['num_prompts']} prompts, "
        f"max_tokens {s['max_tokens']}",
        f"token match: {s['token_match']:.1f}% ({s['matched_tokens']}/{s['total_tokens']} tokens; "
        f"{s['identical_sequences']}/{s['num_prompts']} sequences identical)",
        "first divergence: none" if div is None else
        f"first divergence: prompt {div['prompt']}, position {div['position']}",
        f"|Δ logprob| of chosen tokens: max {s['max_abs_dlogprob']:.3g}, mean {s['mean_abs_dlogprob']:.3g}",
        f"ROUGE-1 {r['rouge1']:.2f}  ROUGE-2 {r['rouge2']:.2f}  ROUGE-L {r['rougeL']:.2f}  "
        f"ROUGE-Lsum {r['rougeLsum']:.2f}",
    ])


def first_prompt_text(s: dict) -> Optional[str]:
    rows = s.get("per_prompt") or []
    return rows[0]["ours"] if rows else None
