"""The engine's step counters reach both frontends' sinks as increments of what they grew."""
from collections import defaultdict

from tritongen.metrics import ENGINE_COUNTERS, update_engine_gauges


class RecordingSink:
    def __init__(self) -> None:
        self.totals: dict = defaultdict(float)
        self.calls: list = []
        self.gauges: dict = {}

    def observe(self, name, value) -> None:
        pass

    def increment(self, name, value, labels=None) -> None:
        self.calls.append((name, value))
        self.totals[name] += value

    def set_gauge(self, name, value) -> None:
        self.gauges[name] = value


def _stats(steps: int, prefill: int, ahead: int, preempted: int) -> dict:
    return dict(num_running=2, num_waiting=1, kv_blocks_total=10, kv_blocks_free=4, prefix_cache_hit_rate=0.5,
                num_steps=steps, num_prefill_steps=prefill, num_steps_ahead=ahead, num_preemptions=preempted)


def test_engine_counters_follow_the_engine_totals():
    sink, seen = RecordingSink(), {}
    update_engine_gauges(_stats(5, 2, 3, 0), sink, seen)
    assert {name for name, _ in sink.calls} == set(ENGINE_COUNTERS)  # every series exists, also at 0
    update_engine_gauges(_stats(9, 3, 6, 1), sink, seen)
    update_engine_gauges(_stats(9, 3, 6, 1), sink, seen)  # nothing new: increments of 0
    assert sink.totals["tritongen_engine_steps_total"] == 9
    assert sink.totals["tritongen_engine_prefill_steps_total"] == 3
    assert sink.totals["tritongen_engine_steps_ahead_total"] == 6
    assert sink.totals["tritongen_num_preemptions_total"] == 1
    assert sink.gauges["tritongen_kv_cache_usage_ratio"] == 0.6


def test_without_a_seen_dict_only_gauges_are_set():
    sink = RecordingSink()
    update_engine_gauges(_stats(5, 2, 3, 0), sink)
    assert not sink.calls and sink.gauges["tritongen_num_requests_running"] == 2


def test_every_engine_counter_follows_a_key_the_engine_reports():
    """A counter whose key the engine's stats() lacks would stay at 0 for ever (update_engine_gauges
    reads a missing key as 0); the restarts come from the supervising AsyncLLM, not the engine."""
    from tritongen import LLM

    stats = LLM("dummy:tiny-llama", device="cpu", num_blocks=16).stats()
    assert set(ENGINE_COUNTERS.values()) - {"engine_restarts"} <= set(stats)
    assert stats["num_mixed_graph_steps"] == 0  # no CUDA graphs on the CPU
