import pytest

from tritongen.core.block_manager import BlockManager
from tritongen.core.sequence import Sequence
from tritongen.types import SamplingParams


def seq(rid, tokens):
    return Sequence(rid, tokens, SamplingParams())


def test_allocate_and_free_returns_every_block():
    bm = BlockManager(8, 4)
    s = seq("a", list(range(10)))
    assert bm.allocate_slots(s, 10)
    assert len(s.block_table) == 3 and bm.num_free_blocks == 5
    bm.free_seq(s)
    assert bm.num_free_blocks == 8 and s.block_table == []


def test_allocation_fails_without_side_effects():
    bm = BlockManager(2, 4)
    s = seq("a", list(range(12)))
    assert not bm.allocate_slots(s, 12)
    assert s.block_table == [] and bm.num_free_blocks == 2


def test_prefix_hit_shares_blocks_and_counts_refs():
    bm = BlockManager(16, 4)
    a = seq("a", list(range(10)))
    assert bm.allocate_slots(a, 10)
    a.num_computed_tokens = 10
    bm.cache_full_blocks(a)  # two full blocks published
    b = seq("b", list(range(8)) + [77, 78, 79])
    hit = bm.get_computed_blocks(b)
    assert hit == a.block_table[:2]
    assert bm.allocate_slots(b, 3, hit)
    assert b.block_table[:2] == a.block_table[:2]
    assert bm.ref_counts[hit[0]] == 2
    bm.free_seq(a)
    assert bm.ref_counts[hit[0]] == 1
    bm.free_seq(b)
    assert bm.num_free_blocks == 16
    # Freed but still cached: a third request hits the same blocks again.
    c = seq("c", list(range(9)))
    assert bm.get_computed_blocks(c) == hit
    assert bm.prefix_cache_hit_rate > 0


def test_last_token_never_comes_from_cache():
    bm = BlockManager(16, 4)
    a = seq("a", list(range(8)))
    bm.allocate_slots(a, 8)
    a.num_computed_tokens = 8
    bm.cache_full_blocks(a)
    same = seq("b", list(range(8)))
    assert len(bm.get_computed_blocks(same)) == 1  # block 2 holds the last token


def test_lru_eviction_reuses_least_recently_freed_and_drops_hash():
    bm = BlockManager(4, 2)
    a = seq("a", [1, 2, 3, 4])
    bm.allocate_slots(a, 4)
    a.num_computed_tokens = 4
    bm.cache_full_blocks(a)
    assert len(bm.cached) == 2
    bm.free_seq(a)
    big = seq("big", list(range(100, 108)))
    assert bm.allocate_slots(big, 8)  # needs all 4 blocks: both cached ones are evicted
    assert bm.cached == {}
    assert bm.get_computed_blocks(seq("again", [1, 2, 3, 4, 5])) == []


def test_prefix_caching_off():
    bm = BlockManager(8, 2, enable_prefix_caching=False)
    a = seq("a", [1, 2, 3, 4])
    bm.allocate_slots(a, 4)
    a.num_computed_tokens = 4
    bm.cache_full_blocks(a)
    assert bm.get_computed_blocks(seq("b", [1, 2, 3, 4, 5])) == []


def test_double_free_is_caught():
    bm = BlockManager(4, 2)
    a = seq("a", [1, 2])
    bm.allocate_slots(a, 2)
    table = list(a.block_table)
    bm.free_seq(a)
    a.block_table = table
    with pytest.raises(AssertionError):
        bm.free_seq(a)
