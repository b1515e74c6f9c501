"""Benchmark datasets: lists of (prompt, output length) that every bench command shares.

Specs (the --dataset flag):
  sharegpt-like   synthetic, deterministic in --seed: prompt and output lengths drawn to match
                  ShareGPT as vLLM's benchmark samples it (about 244 prompt / 239 output tokens on
                  average, prompt <= 1024, prompt + output <= 2048), prompt text cut from the corpus.
  sharegpt:PATH   a real ShareGPT JSON, sampled by vLLM's rules (see sample_sharegpt).
  random:IN:OUT   IN random token ids per prompt, OUT output tokens (token-level targets).
  file:PATH       JSONL, one {"prompt": str | [ids], "output_len": int} per line.
Output lengths are enforced by the load generator with ignore_eos and min_tokens = max_tokens.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Optional, Union

from tritongen.bench.corpus import CorpusTokens
from tritongen.jsonl import read_lines

# Targets and bounds of the ShareGPT sample that vLLM's benchmark draws.
SHAREGPT_PROMPT_MEAN = 244.0
SHAREGPT_OUTPUT_MEAN = 239.0
MIN_LEN = 4  # vLLM drops pairs where either side is shorter
MAX_PROMPT_LEN = 1024
MAX_TOTAL_LEN = 2048
# Shape (log-space std) of the lognormals. ShareGPT lengths are heavy-tailed, prompts more than
# outputs; only the means are fitted, so these set how wide the spread is around them.
PROMPT_SIGMA = 1.0
OUTPUT_SIGMA = 0.9

_N = NormalDist()


@dataclass
class BenchRequest:
    """One benchmark request: what to send and how many tokens must come back."""

    prompt: Union[str, list[int]]
    """Text, or token ids for token-level datasets (random:IN:OUT)."""
    prompt_len: int
    """Prompt length in tokens of the benchmark's tokenizer."""
    output_len: int
    """Tokens to generate (max_tokens = min_tokens, ignore_eos)."""


# -- sharegpt-like lengths -----------------------------------------------------------------------

def _truncated_mean(mu: float, sigma: float, lo: float, hi: float) -> float:
    """Mean of a lognormal(mu, sigma) restricted to [lo, hi] (closed form)."""
    a, b = (math.log(lo) - mu) / sigma, (math.log(hi) - mu) / sigma
    mass = _N.cdf(b) - _N.cdf(a)
    return math.exp(mu + sigma * sigma / 2) * (_N.cdf(b - sigma) - _N.cdf(a - sigma)) / mass


def _fit_mu(target: float, sigma: float, caps: list[float]) -> float:
    """mu such that the lognormal truncated to [MIN_LEN, cap], averaged over caps, has mean target."""
    lo, hi = math.log(MIN_LEN), math.log(max(caps))
    for _ in range(80):
        mu = (lo + hi) / 2
        mean = sum(_truncated_mean(mu, sigma, MIN_LEN, c) for c in caps) / len(caps)
        lo, hi = (mu, hi) if mean < target else (lo, mu)
    return (lo + hi) / 2


def _truncated_quantile(u: float, mu: float, sigma: float, lo: float, hi: float) -> float:
    a, b = _N.cdf((math.log(lo) - mu) / sigma), _N.cdf((math.log(hi) - mu) / sigma)
    p = min(max(a + u * (b - a), 1e-12), 1 - 1e-12)
    return math.exp(mu + sigma * _N.inv_cdf(p))


def _stratified(n: int, rng: random.Random) -> list[float]:
    """n uniforms, one in each of n equal strata, in random order (Latin hypercube): the sample
    mean then sits close to the distribution's mean even for small n."""
    order = list(range(n))
    rng.shuffle(order)
    return [(k + rng.random()) / n for k in order]


def sharegpt_like_lengths(num_prompts: int, seed: int = 0) -> list[tuple[int, int]]:
    """(prompt_len, output_len) pairs: lognormals fitted to the ShareGPT means, within vLLM's bounds."""
    rng = random.Random(seed)
    mu_p = _fit_mu(SHAREGPT_PROMPT_MEAN, PROMPT_SIGMA, [MAX_PROMPT_LEN])
    grid = [_truncated_quantile((i + 0.5) / 256, mu_p, PROMPT_SIGMA, MIN_LEN, MAX_PROMPT_LEN) for i in range(256)]
    mu_o = _fit_mu(SHAREGPT_OUTPUT_MEAN, OUTPUT_SIGMA, [MAX_TOTAL_LEN - p for p in grid])
    pairs = []
    for up, uo in zip(_stratified(num_prompts, rng), _stratified(num_prompts, rng)):
        p = round(_truncated_quantile(up, mu_p, PROMPT_SIGMA, MIN_LEN, MAX_PROMPT_LEN))
        p = min(max(p, MIN_LEN), MAX_PROMPT_LEN)
        cap = MAX_TOTAL_LEN - p
        o = min(max(round(_truncated_quantile(uo, mu_o, OUTPUT_SIGMA, MIN_LEN, cap)), MIN_LEN), cap)
        pairs.append((p, o))
    return pairs


def sharegpt_like(num_prompts: int, seed: int, tokenizer, corpus: Optional[str] = None) -> list[BenchRequest]:
    """sharegpt-like requests: each prompt is a corpus window of its drawn length."""
    tokens = CorpusTokens(tokenizer, corpus)
    rng = random.Random(seed + 1)
    # Distinct start offsets, so that no two prompts share a prefix-cache block by construction.
    starts = rng.sample(range(len(tokens.ids)), num_prompts) if num_prompts <= len(tokens.ids) else \
        [rng.randrange(len(tokens.ids)) for _ in range(num_prompts)]
    out = []
    for (p, o), start in zip(sharegpt_like_lengths(num_prompts, seed), starts):
        text, n = tokens.text_of_length(start, p)
        out.append(BenchRequest(text, n, min(o, MAX_TOTAL_LEN - n)))
    return out


# -- other sources --------------------------------------------------------------------------------

def sample_sharegpt(path: str, num_prompts: int, seed: int, tokenizer) -> list[BenchRequest]:
    """vLLM's ShareGPT sampling: conversations with at least two turns, shuffled with the seed; the
    first turn is the prompt and the second's token count the output length; pairs with a side
    shorter than 4 tokens, a prompt over 1024 or a total over 2048 are skipped."""
    data = json.loads(Path(path).expanduser().read_text())
    convs = [d["conversations"] for d in data if len(d.get("conversations") or []) >= 2]
    random.Random(seed).shuffle(convs)
    out: list[BenchRequest] = []
    for conv in convs:
        if len(out) == num_prompts:
            break
        prompt = conv[0]["value"]
        p = len(tokenizer.encode(prompt, add_special_tokens=False))
        o = len(tokenizer.encode(conv[1]["value"], add_special_tokens=False))
        if p < MIN_LEN or o < MIN_LEN or p > MAX_PROMPT_LEN or p + o > MAX_TOTAL_LEN:
            continue
        out.append(BenchRequest(prompt, p, o))
    if len(out) < num_prompts:
        raise ValueError(f"{path} has only {len(out)} usable conversations, {num_prompts} requested")
    return out


def random_tokens(num_prompts: int, input_len: int, output_len: int, seed: int, vocab_size: int,
                  special_ids: set[int] = frozenset()) -> list[BenchRequest]:
    """Prompts of exactly input_len uniform token ids (special tokens excluded)."""
    rng = random.Random(seed)
    out = []
    for _ in range(num_prompts):
        ids: list[int] = []
        while len(ids) < input_len:
            t = rng.randrange(vocab_size)
            if t not in special_ids:
                ids.append(t)
        out.append(BenchRequest(ids, input_len, output_len))
    return out


def from_jsonl(path: str, num_prompts: Optional[int], tokenizer) -> list[BenchRequest]:
    """{"prompt": str | [ids], "output_len": int} per line ("max_tokens" is accepted too)."""
    out = []
    for lineno, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        d = json.loads(line)
        if "prompt" not in d:
            raise ValueError(f"{path}:{lineno}: no 'prompt'")
        prompt = d["prompt"]
        p = len(prompt) if isinstance(prompt, list) else len(tokenizer.encode(prompt, add_special_tokens=False))
        out.append(BenchRequest(prompt, p, int(d.get("output_len", d.get("max_tokens", 128)))))
        if num_prompts is not None and len(out) == num_prompts:
            break
    return out


def load_dataset(spec: str, num_prompts: int, seed: int, tokenizer, corpus: Optional[str] = None) -> list[BenchRequest]:
    """Parse a --dataset spec (see the module docstring) into requests."""
    if spec == "sharegpt-like":
        return sharegpt_like(num_prompts, seed, tokenizer, corpus)
    kind, _, rest = spec.partition(":")
    if kind == "sharegpt" and rest:
        return sample_sharegpt(rest, num_prompts, seed, tokenizer)
    if kind == "file" and rest:
        return from_jsonl(rest, num_prompts, tokenizer)
    if kind == "random" and rest:
        try:
            input_len, output_len = (int(x) for x in rest.split(":"))
        except ValueError:
            raise ValueError(f"bad dataset {spec!r}: expected random:IN:OUT with integers") from None
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        return random_tokens(num_prompts, input_len, output_len, seed, len(tokenizer), special)
    raise ValueError(f"unknown dataset {spec!r}; use sharegpt-like, sharegpt:PATH, random:IN:OUT or file:PATH")


def prompt_text(req: BenchRequest, tokenizer) -> str:
    """The request's prompt as text (token-id prompts are decoded) for text-only targets."""
    return req.prompt if isinstance(req.prompt, str) else tokenizer.decode(req.prompt)
