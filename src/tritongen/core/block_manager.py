"""Paged KV-cache bookkeeping: fixed-size blocks, ref counts, prefix caching with LRU eviction.

Pure Python. A block's KV lives on the device; here we only track who holds which block id.
Full blocks are identified by a hash chained over all tokens before them, so a hit on block i
implies every earlier block matched too. Free blocks that still hold a cached prefix stay in the
hash table until they are reused for something else (evicted least recently freed first).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Optional

from tritongen.core.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token, got {num_blocks}x{block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[Optional[int]] = [None] * num_blocks
        self.block_tokens: list[Optional[tuple[int, ...]]] = [None] * num_blocks
        self.cached: dict[int, int] = {}
        """hash -> block id of a full block whose KV is valid."""
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        """Blocks with ref count 0, least recently freed first (the eviction order)."""
        self.prefix_queries = 0
        self.prefix_hits = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def _hashes(self, seq: Sequence, num_full_blocks: int) -> list[int]:
        """Extend seq.block_hashes to cover num_full_blocks blocks (hashes depend only on tokens)."""
        bs = self.block_size
        while len(seq.block_hashes) < num_full_blocks:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if i else 0
            seq.block_hashes.append(hash((parent, tuple(seq.token_slice(i * bs, (i + 1) * bs)))))
        return seq.block_hashes

    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """Longest run of cached full blocks matching the start of seq's tokens.

        The last token is never taken from the cache: its logits are needed to sample.
        """
        if not self.enable_prefix_caching:
            return []
        num_full = (seq.num_tokens - 1) // self.block_size
        hashes = self._hashes(seq, num_full)
        blocks: list[int] = []
        bs = self.block_size
        for i in range(num_full):
            block = self.cached.get(hashes[i])
            # Guard against hash collisions: the block must hold exactly these tokens.
            if block is None or self.block_tokens[block] != tuple(seq.token_slice(i * bs, (i + 1) * bs)):
                break
            blocks.append(block)
        self.prefix_queries += seq.num_tokens
        self.prefix_hits += len(blocks) * bs
        return blocks

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] = ()) -> bool:
        """Give seq blocks for computed_blocks plus num_new_tokens more tokens; False if not enough.

        On success computed_blocks are appended to the block table (the caller advances
        num_computed_tokens by their tokens); on failure nothing changes.
        """
        total = seq.num_computed_tokens + len(computed_blocks) * self.block_size + num_new_tokens
        num_needed = cdiv(total, self.block_size) - len(seq.block_table) - len(computed_blocks)
        num_revived = sum(1 for b in computed_blocks if self.ref_counts[b] == 0)
        if num_needed + num_revived > len(self.free):
            return False
        for b in computed_blocks:
            if self.ref_counts[b] == 0:
                del self.free[b]
            self.ref_counts[b] += 1
        seq.block_table.extend(computed_blocks)
        for _ in range(max(num_needed, 0)):
            seq.block_table.append(self._take_free_block())
        return True

    def _take_free_block(self) -> int:
        block, _ = self.free.popitem(last=False)
        h = self.block_hash[block]
        if h is not None:  # evict the cached prefix this block held
            if self.cached.get(h) == block:
                del self.cached[h]
            self.block_hash[block] = None
            self.block_tokens[block] = None
        self.ref_counts[block] = 1
        return block

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Publish blocks that became full of computed tokens so later requests can share them."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= seq.num_registered_blocks:
            return
        hashes = self._hashes(seq, num_full)
        bs = self.block_size
        for i in range(seq.num_registered_blocks, num_full):
            block = seq.block_table[i]
            h = hashes[i]
            if h not in self.cached and self.block_hash[block] is None:
                self.cached[h] = block
                self.block_hash[block] = h
                self.block_tokens[block] = tuple(seq.token_slice(i * bs, (i + 1) * bs))
        seq.num_registered_blocks = num_full

    def free_seq(self, seq: Sequence) -> None:
        """Drop seq's references. Tail blocks go first in the eviction order: they are the least
        likely to be shared."""
        for block in reversed(seq.block_table):
            self.ref_counts[block] -= 1
            assert self.ref_counts[block] >= 0, f"block {block} freed twice"
            if self.ref_counts[block] == 0:
                self.free[block] = None
        seq.block_table = []

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (only blocks that nobody holds)."""
        for block in self.free:
            self.block_hash[block] = None
            self.block_tokens[block] = None
        self.cached = {h: b for h, b in self.cached.items() if self.ref_counts[b] > 0}
