"""Routing across replicas the way the Gateway API Inference Extension's endpoint picker does it.

The picker (llm-d-router's EPP, the reference implementation of the extension) scrapes each
replica's /metrics, reads `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` and
`vllm:cache_config_info{block_size, num_gpu_blocks}` (our servers export them as aliases of the
tritongen_* gauges), and scores every replica. The default profile adds

- prefix-cache-scorer: the fraction of the prompt's blocks that the picker's own approximate index
  says this replica has served recently. Without a tokenizer the prompt's bytes are packed into
  pseudo-tokens of 4 bytes, blocks of max(64, block_size) pseudo-tokens are hashed in a chain (each
  hash covers the block and every block before it), and each replica keeps an LRU of
  num_gpu_blocks hashes;
- queue-scorer: (max waiting - waiting) / (max - min) over the candidates, 1 when all are equal;
- kv-cache-utilization-scorer: 1 - vllm:kv_cache_usage_perc;

with weights 3 (prefix), 2 (queue) and 2 (KV), the highest total winning: the profile that the
extension's inferencepool chart and llm-d's guides configure, and that deploy/helm ships.

`PickerRouter` re-implements that scoring (not the code) so that a test can compare it with
round-robin on real replicas (`tritongen.bench.replicas`); nothing here is needed to deploy.
"""
from __future__ import annotations

import hashlib
import itertools
import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

BYTES_PER_TOKEN = 4  # the picker's tokenizer-free estimate
MIN_BLOCK_TOKENS = 64  # the picker clamps smaller block sizes up to this


@dataclass
class ReplicaState:
    """What the picker knows about one replica after its last scrape."""

    url: str
    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    block_size: Optional[int] = None
    num_gpu_blocks: Optional[int] = None


def parse_picker_metrics(url: str, text: str) -> ReplicaState:
    """A replica's state from its Prometheus exposition, by the names the picker reads."""
    from prometheus_client.parser import text_string_to_metric_families

    state = ReplicaState(url)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:num_requests_waiting":
                state.waiting = int(sample.value)
            elif sample.name == "vllm:num_requests_running":
                state.running = int(sample.value)
            elif sample.name == "vllm:kv_cache_usage_perc":
                state.kv_usage = float(sample.value)
            elif sample.name == "vllm:cache_config_info":
                state.block_size = int(sample.labels["block_size"])
                state.num_gpu_blocks = int(sample.labels["num_gpu_blocks"])
    return state


def block_hashes(prompt: str, model: str, block_tokens: int) -> list[int]:
    """Chained hashes of the prompt's blocks of `block_tokens` pseudo-tokens; the first also covers
    the model name, so two models never share an entry. A trailing partial block is hashed too."""
    data = prompt.encode("utf-8")
    step = block_tokens * BYTES_PER_TOKEN
    prev = hashlib.blake2b(model.encode(), digest_size=8).digest()
    out = []
    for start in range(0, len(data), step):
        prev = hashlib.blake2b(prev + data[start:start + step], digest_size=8).digest()
        out.append(int.from_bytes(prev, "little"))
    return out


class PrefixIndex:
    """Per replica, the block hashes of the prompts routed to it, least recently used first out."""

    def __init__(self) -> None:
        self._lru: dict[str, OrderedDict[int, None]] = {}

    def matched_blocks(self, url: str, hashes: list[int]) -> int:
        """Leading blocks of `hashes` that `url` holds (a chain: a hit on i implies 0..i-1)."""
        lru = self._lru.get(url, {})
        n = 0
        for h in hashes:
            if h not in lru:
                break
            n += 1
        return n

    def record(self, url: str, hashes: list[int], capacity: int) -> None:
        lru = self._lru.setdefault(url, OrderedDict())
        for h in hashes:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > capacity:
            lru.popitem(last=False)


class RoundRobin:
    name = "round-robin"

    def __init__(self, urls: list[str]) -> None:
        self._next = itertools.cycle(urls)

    def pick(self, prompt: str, states: dict[str, ReplicaState]) -> str:
        return next(self._next)


class PickerRouter:
    """prefix-cache + queue + kv-cache-utilization scorers (weights 3:2:2); the highest total
    wins, ties at random."""

    name = "prefix-affinity (picker scoring)"

    def __init__(self, model: str, prefix_weight: float = 3.0, queue_weight: float = 2.0,
                 kv_weight: float = 2.0, default_block_tokens: int = 16, default_capacity: int = 31250,
                 seed: int = 0) -> None:
        self.model = model
        self.weights = (prefix_weight, queue_weight, kv_weight)
        self.default_block_tokens, self.default_capacity = default_block_tokens, default_capacity
        self.index = PrefixIndex()
        self._rng = random.Random(seed)

    def _block_tokens(self, states: dict[str, ReplicaState]) -> int:
        sizes = [s.block_size for s in states.values() if s.block_size]
        return max(MIN_BLOCK_TOKENS, sizes[0] if sizes else self.default_block_tokens)

    def scores(self, hashes: list[int], states: dict[str, ReplicaState]) -> dict[str, float]:
        """Each replica's total for a prompt whose block hashes are `hashes`."""
        w_prefix, w_queue, w_kv = self.weights
        total = len(hashes) or 1
        lo = min(s.waiting for s in states.values())
        hi = max(s.waiting for s in states.values())
        out = {}
        for url, state in states.items():
            queue = 1.0 if hi == lo else (hi - state.waiting) / (hi - lo)
            out[url] = (w_prefix * self.index.matched_blocks(url, hashes) / total + w_queue * queue
                        + w_kv * (1.0 - state.kv_usage))
        return out

    def pick(self, prompt: str, states: dict[str, ReplicaState]) -> str:
        hashes = block_hashes(prompt, self.model, self._block_tokens(states))
        scores = self.scores(hashes, states)
        best = max(scores.values())
        url = self._rng.choice(sorted(u for u, s in scores.items() if s == best))
        self.index.record(url, hashes, states[url].num_gpu_blocks or self.default_capacity)
        return url
