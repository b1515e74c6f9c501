"""TensorRT-LLM's and FasterTransformer's request vocabulary beyond plain sampling: word lists
(ids + offsets), the inputs we refuse by name, and per-request perf metrics.

Word lists (`stop_words_list`, `bad_words_list`) are INT32 [2, N] per request: row 0 holds the
ids of every word one after the other, row 1 the end offset of each word, -1 padded. Perf
metrics are wall-clock nanoseconds (time.time_ns(), the clock a client on the same host reads),
named as TensorRT-LLM names them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from tritongen.triton.values import InvalidInput


@dataclass(frozen=True)
class Unsupported:
    name: str
    why: str
    allowed: object = None
    """The one value accepted (it asks for nothing we lack); None: any presence is refused."""


UNSUPPORTED: tuple[Unsupported, ...] = (
    Unsupported("return_context_logits", "context logits are not returned", False),
    Unsupported("return_generation_logits", "generation logits are not returned", False),
    Unsupported("num_return_sequences", "one sequence per request", 1),
    Unsupported("lora_task_id", "LoRA adapters are not supported"),
    Unsupported("lora_weights", "LoRA adapters are not supported"),
    Unsupported("lora_config", "LoRA adapters are not supported"),
    Unsupported("prompt_embedding_table", "prompt tuning is not supported"),
    Unsupported("prompt_vocab_size", "prompt tuning is not supported"),
)


def refuse_unsupported(request, pb) -> None:
    """INVALID_ARG naming the first input that asks for something we do not do."""
    for item in UNSUPPORTED:
        tensor = pb.get_input_tensor_by_name(request, item.name)
        if tensor is None:
            continue
        flat = np.asarray(tensor.as_numpy()).reshape(-1)
        if item.allowed is not None and flat.size == 1 and flat.dtype != np.object_ and flat[0] == item.allowed:
            continue
        shown = f" (got {flat[0]!r})" if flat.size == 1 and item.allowed is not None else ""
        raise InvalidInput(f"input '{item.name}' is not supported: {item.why}{shown}")


def word_lists(array: Optional[np.ndarray], name: str) -> list[list[int]]:
    """[2, N] ids + end offsets (-1 padded) -> the words as lists of ids."""
    if array is None:
        return []
    arr = np.asarray(array)
    if arr.dtype.kind not in "iu":
        raise InvalidInput(f"input '{name}' must be an INT32 tensor, got {arr.dtype}")
    if arr.size == 0:
        return []
    if arr.ndim < 2 or arr.shape[-2] != 2:
        raise InvalidInput(f"input '{name}' must have shape [2, N] (ids, offsets) per request, got {list(arr.shape)}")
    arr = arr.reshape(-1, 2, arr.shape[-1])
    if arr.shape[0] != 1:
        raise InvalidInput(f"input '{name}' holds {arr.shape[0]} requests' lists; send one per request")
    ids, offsets = arr[0, 0].tolist(), arr[0, 1].tolist()
    words, start = [], 0
    for end in offsets:
        if end < 0:
            break
        if end <= start or end > len(ids) or any(t < 0 for t in ids[start:end]):
            raise InvalidInput(f"input '{name}': offset {end} does not end a word of ids after offset {start} "
                               f"(offsets must increase and stay within the {len(ids)} ids)")
        words.append([int(t) for t in ids[start:end]])
        start = end
    return words


PERF_OUTPUT_NAMES = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns",
                     "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks")


@dataclass
class PerfMetrics:
    """One request's timings (wall clock, ns; 0 = not yet) and KV cache block counts."""

    arrival_time_ns: int
    first_scheduled_time_ns: int = 0
    first_token_time_ns: int = 0
    last_token_time_ns: int = 0
    kv_cache_reused_blocks: int = 0
    kv_cache_alloc_total_blocks: int = 0

    @property
    def kv_cache_alloc_new_blocks(self) -> int:
        return self.kv_cache_alloc_total_blocks - self.kv_cache_reused_blocks

    def update(self, out, now_ns: int, block_size: int) -> None:
        """After an engine output `out` (a RequestOutput) seen at `now_ns`."""
        scheduled = out.times.first_scheduled_time if out.times is not None else None
        if scheduled is not None and not self.first_scheduled_time_ns:
            self.first_scheduled_time_ns = int(scheduled * 1e9)
        if out.delta_token_ids:
            self.first_token_time_ns = self.first_token_time_ns or now_ns
            self.last_token_time_ns = now_ns
        self.kv_cache_reused_blocks = out.num_cached_tokens // block_size
        tokens = out.num_prompt_tokens + out.num_output_tokens
        self.kv_cache_alloc_total_blocks = -(-tokens // block_size)

    def values(self) -> dict[str, tuple[int, type]]:
        return {"arrival_time_ns": (self.arrival_time_ns, np.int64),
                "first_scheduled_time_ns": (self.first_scheduled_time_ns, np.int64),
                "first_token_time_ns": (self.first_token_time_ns, np.int64),
                "last_token_time_ns": (self.last_token_time_ns, np.int64),
                "kv_cache_alloc_new_blocks": (self.kv_cache_alloc_new_blocks, np.int32),
                "kv_cache_reused_blocks": (self.kv_cache_reused_blocks, np.int32),
                "kv_cache_alloc_total_blocks": (self.kv_cache_alloc_total_blocks, np.int32)}
