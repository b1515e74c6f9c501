"""Routing as the endpoint picker does it (tritongen.bench.routing) against round-robin, first on
hand-made replica states, then on three real OpenAI-front replicas with a shared-prefix workload."""
import pytest

from tritongen.bench.routing import (MIN_BLOCK_TOKENS, PickerRouter, PrefixIndex, ReplicaState, RoundRobin,
                                     block_hashes)

PREFIX = "You are a careful assistant. " * 80  # 2,320 bytes: 9 blocks of 64 pseudo-tokens


def test_block_hashes_chain_over_the_prefix_and_the_model():
    a = block_hashes(PREFIX + "first question", "m", MIN_BLOCK_TOKENS)
    b = block_hashes(PREFIX + "another one", "m", MIN_BLOCK_TOKENS)
    shared = len(PREFIX.encode()) // (MIN_BLOCK_TOKENS * 4)
    assert a[:shared] == b[:shared] and a[shared] != b[shared]
    assert block_hashes(PREFIX, "other-model", MIN_BLOCK_TOKENS)[0] != a[0]
    assert block_hashes("x" + PREFIX, "m", MIN_BLOCK_TOKENS)[1] != a[1]  # a hash covers all before it


def test_prefix_index_is_an_lru_of_blocks():
    index = PrefixIndex()
    index.record("r", [1, 2, 3], capacity=4)
    assert index.matched_blocks("r", [1, 2, 9]) == 2 and index.matched_blocks("other", [1]) == 0
    index.record("r", [7, 8], capacity=4)  # evicts 1, the least recently used
    assert index.matched_blocks("r", [1, 2]) == 0 and index.matched_blocks("r", [7, 8]) == 2


def _states(waiting=(0, 0, 0), kv=(0.0, 0.0, 0.0)):
    return {f"r{i}": ReplicaState(f"r{i}", waiting=w, kv_usage=k, block_size=16, num_gpu_blocks=1000)
            for i, (w, k) in enumerate(zip(waiting, kv))}


def test_picker_follows_the_prefix_and_leaves_a_busy_replica():
    router = PickerRouter("m", seed=1)
    first = router.pick(PREFIX + "q1", _states())
    assert all(router.pick(PREFIX + f"q{i}", _states()) == first for i in range(2, 6))
    # A long queue on the affine replica outweighs the prefix only partly: a full prefix match (3)
    # against the queue (2) and KV (2) scores of an idle replica.
    busy = _states(waiting=tuple(9 if f"r{i}" == first else 0 for i in range(3)),
                   kv=tuple(0.9 if f"r{i}" == first else 0.0 for i in range(3)))
    assert router.pick(PREFIX + "q7", busy) != first
    # A new prefix goes where the load is lowest.
    assert router.pick("a different system prompt " * 40, _states(waiting=(5, 0, 5))) == "r1"


def test_round_robin_cycles():
    rr = RoundRobin(["a", "b", "c"])
    assert [rr.pick("p", {}) for _ in range(4)] == ["a", "b", "c", "a"]


@pytest.mark.timeout(600)
def test_prefix_affinity_raises_the_hit_rate_over_round_robin_on_real_replicas():
    from tritongen.bench.replicas import compare, format_table, start_replicas, stop_replicas

    # 48 blocks of 16 tokens each: room for the requests in flight and one or two prefixes, so a
    # replica that sees every prefix (round-robin) keeps evicting them.
    replicas = start_replicas(3, "dummy:tiny-llama", ["--device", "cpu", "--dtype", "float32", "--num-blocks", "48",
                                                      "--max-num-seqs", "3"])
    try:
        rr, picker = compare([r.url for r in replicas], "dummy:tiny-llama", groups=6, per_group=4,
                             prefix_lines=12, concurrency=3, max_tokens=2)
    finally:
        stop_replicas(replicas)
    print("\n" + format_table([rr, picker]))
    assert rr.preemptions == picker.preemptions == 0
    assert sum(rr.per_replica.values()) == sum(picker.per_replica.values()) == 24
    assert picker.hit_rate > rr.hit_rate + 0.1, format_table([rr, picker])
    assert all(r.process.returncode is not None for r in replicas)
