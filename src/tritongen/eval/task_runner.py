"""Score a task's items through a backend: accuracy per kind, and per-item results."""
from __future__ import annotations

import time

from tritongen.eval.backends import split_tokens
from tritongen.eval.tasks import GenItem, Item, MCItem, gen_correct


def score_generation(backend, items: list[GenItem]) -> list[dict]:
    outputs = backend.generate(items)
    return [{"kind": "generation", "prompt": it.prompt[-80:], "answers": it.answers, "output": out,
             "correct": gen_correct(it, out)} for it, out in zip(items, outputs)]


def score_multiple_choice(backend, items: list[MCItem]) -> list[dict]:
    pairs, owners = [], []
    for k, it in enumerate(items):
        for choice in it.choices:
            pairs.append(split_tokens(backend.tokenizer, it.prompt, choice))
            owners.append(k)
    scores = backend.loglikelihood(pairs)
    per_item: list[list[float]] = [[] for _ in items]
    for k, (lp, _greedy) in zip(owners, scores):
        per_item[k].append(lp)
    results = []
    for it, lps in zip(items, per_item):
        best = max(range(len(lps)), key=lps.__getitem__)
        norm = [lp / max(len(c), 1) for lp, c in zip(lps, it.choices)]
        best_norm = max(range(len(norm)), key=norm.__getitem__)
        results.append({"kind": "multiple_choice", "prompt": it.prompt[-80:], "choices": it.choices,
                        "answer": it.answer, "loglikelihoods": lps, "correct": best == it.answer,
                        "correct_norm": best_norm == it.answer})
    return results


def run_task(backend, items: list[Item]) -> dict:
    """Accuracy of `items` through `backend`; generation and multiple-choice items may be mixed."""
    t0 = time.perf_counter()
    gen = [it for it in items if isinstance(it, GenItem)]
    mc = [it for it in items if isinstance(it, MCItem)]
    results = (score_generation(backend, gen) if gen else []) + (score_multiple_choice(backend, mc) if mc else [])
    summary: dict = {"backend": backend.name, "num_items": len(items), "elapsed_s": time.perf_counter() - t0}
    if gen:
        summary["exact_match"] = sum(r["correct"] for r in results if r["kind"] == "generation") / len(gen)
    if mc:
        mc_results = [r for r in results if r["kind"] == "multiple_choice"]
        summary["acc"] = sum(r["correct"] for r in mc_results) / len(mc)
        summary["acc_norm"] = sum(r["correct_norm"] for r in mc_results) / len(mc)
    summary["accuracy"] = sum(r["correct"] for r in results) / len(results)
    return {"summary": summary, "items": results}


def format_task(summary: dict, task: str) -> str:
    lines = [f"eval task {task} via {summary['backend']}: {summary['num_items']} items "
             f"in {summary['elapsed_s']:.1f} s"]
    if "exact_match" in summary:
        lines.append(f"exact match (generation): {summary['exact_match']:.4f}")
    if "acc" in summary:
        lines.append(f"acc (multiple choice): {summary['acc']:.4f}   acc_norm: {summary['acc_norm']:.4f}")
    lines.append(f"accuracy: {summary['accuracy']:.4f}")
    return "\n".join(lines)
