"""Eval tasks: items, the JSONL format, the built-in Shakespeare tasks, normalisation and scoring.

JSONL, one item per line (docs/eval.md):
  generation       {"prompt": str, "answer": str | [str, ...], "max_tokens"?: int, "stop"?: [str],
                    "match"?: "exact" | "first_word"}
  multiple choice  {"prompt": str, "choices": [str, ...], "answer": int | str}
Generation is greedy; the output is correct when, after normalisation, it equals an answer
("exact") or its first word does ("first_word"). A multiple-choice item is correct when the
answer has the highest loglikelihood given the prompt (acc), or the highest per character of the
choice (acc_norm, as lm-eval reports it).
Built-in tasks, cut from the shipped Shakespeare text (deterministic in the seed):
  builtin:lastword     LAMBADA-style: a few lines of verse, predict the last word (generation).
  builtin:lastword-mc  the same items as a 4-way choice between the last word and 3 others.
"""
from __future__ import annotations

import json
import random
import re
import string
from dataclasses import dataclass, field
from typing import Optional, Union

from tritongen.jsonl import read_lines

BUILTIN_TASKS = ("lastword", "lastword-mc")


@dataclass
class GenItem:
    prompt: str
    answers: list[str]
    max_tokens: int = 16
    stop: list[str] = field(default_factory=lambda: ["\n"])
    match: str = "exact"


@dataclass
class MCItem:
    prompt: str
    choices: list[str]
    answer: int


Item = Union[GenItem, MCItem]


def normalize(text: str) -> str:
    """Lowercase, drop punctuation and the articles a/an/the, collapse whitespace (SQuAD-style)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in string.punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def gen_correct(item: GenItem, output: str) -> bool:
    got = normalize(output)
    if item.match == "first_word":
        got = got.split()[0] if got.split() else ""
    return any(got == normalize(a) for a in item.answers)


def parse_item(d: dict, where: str) -> Item:
    if "prompt" not in d or "answer" not in d:
        raise ValueError(f"{where}: an item needs 'prompt' and 'answer'")
    if "choices" in d:
        choices = [str(c) for c in d["choices"]]
        answer = d["answer"]
        index = answer if isinstance(answer, int) else choices.index(str(answer)) if str(answer) in choices else -1
        if not 0 <= index < len(choices):
            raise ValueError(f"{where}: answer {answer!r} is not one of the {len(choices)} choices")
        return MCItem(d["prompt"], choices, index)
    answers = d["answer"] if isinstance(d["answer"], list) else [d["answer"]]
    match = d.get("match", "exact")
    if match not in ("exact", "first_word"):
        raise ValueError(f"{where}: match must be 'exact' or 'first_word', got {match!r}")
    return GenItem(d["prompt"], [str(a) for a in answers], int(d.get("max_tokens", 16)),
                   list(d.get("stop", ["\n"])), match)


def load_jsonl(path: str) -> list[Item]:
    items = []
    for lineno, line in enumerate(read_lines(path), 1):
        if line.strip():
            items.append(parse_item(json.loads(line), f"{path}:{lineno}"))
    if not items:
        raise ValueError(f"task file {path} has no items")
    return items


def _lastword_candidates(lines: list[str]) -> list[int]:
    """Indices of lines that end a passage well: 6+ words, the last one alphabetic and 4+ letters."""
    out = []
    for i, line in enumerate(lines):
        words = line.split()
        if i >= 3 and len(words) >= 6 and words[-1].isalpha() and len(words[-1]) >= 4:
            out.append(i)
    return out


def builtin_lastword(num_items: int, seed: int = 0, corpus: Optional[str] = None,
                     multiple_choice: bool = False) -> list[Item]:
    """LAMBADA-style items: three lines of context plus a line whose last word is to be predicted."""
    from tritongen.bench.corpus import corpus_lines

    lines = corpus_lines(corpus)
    candidates = _lastword_candidates(lines)
    rng = random.Random(seed)
    picked = sorted(rng.sample(candidates, min(num_items, len(candidates))))
    vocabulary = sorted({lines[i].split()[-1] for i in candidates})
    items: list[Item] = []
    for i in picked:
        words = lines[i].split()
        prompt = "\n".join(lines[i - 3:i] + [" ".join(words[:-1])])
        word = words[-1]
        if not multiple_choice:
            items.append(GenItem(prompt, [word], max_tokens=6, stop=["\n"], match="first_word"))
            continue
        others = [w for w in rng.sample(vocabulary, 8) if w.lower() != word.lower()][:3]
        choices = [" " + w for w in others]
        answer = rng.randrange(len(choices) + 1)
        choices.insert(answer, " " + word)
        items.append(MCItem(prompt, choices, answer))
    return items


def load_task(spec: str, limit: Optional[int] = None, seed: int = 0, corpus: Optional[str] = None) -> list[Item]:
    """`builtin` (= builtin:lastword), builtin:<name>, or a JSONL path; at most `limit` items."""
    if spec == "builtin":
        spec = "builtin:lastword"
    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in BUILTIN_TASKS:
            raise ValueError(f"unknown built-in task {name!r}; available: {', '.join(BUILTIN_TASKS)}")
        return builtin_lastword(limit or 100, seed, corpus, multiple_choice=name == "lastword-mc")
    items = load_jsonl(spec)
    return items[:limit] if limit else items
