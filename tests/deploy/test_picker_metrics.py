"""The names the Gateway API Inference Extension's endpoint picker reads, on both exporters:
vllm:num_requests_waiting / _running, vllm:kv_cache_usage_perc and vllm:cache_config_info
{block_size, num_gpu_blocks}, each mirroring a tritongen_* value."""
import weakref

from prometheus_client.parser import text_string_to_metric_families

from tritongen import metrics
from tritongen.bench.routing import parse_picker_metrics
from tritongen.metrics import update_engine_gauges
from tritongen.openai.observability import PrometheusSink
from tritongen.triton.metric_families import TritonMetricsSink


def _stats(**kw) -> dict:
    stats = dict(num_running=2, num_waiting=3, kv_blocks_total=40, kv_blocks_free=30, block_size=16,
                 prefix_cache_hit_rate=0.25)
    stats.update(kw)
    return stats


def _samples(text: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def test_openai_exporter_publishes_the_picker_names():
    sink = PrometheusSink("m")
    update_engine_gauges(_stats(), sink)
    text = sink.exposition()[0].decode()
    state = parse_picker_metrics("u", text)
    assert (state.waiting, state.running, state.kv_usage) == (3, 2, 0.25)
    assert (state.block_size, state.num_gpu_blocks) == (16, 40)
    by_name = {s.name: s for s in _samples(text)}
    assert by_name["vllm:num_requests_waiting"].labels == {"model_name": "m"}
    assert by_name["tritongen_kv_cache_block_size"].value == 16


def test_cache_info_keeps_one_series_when_the_cache_changes():
    sink = PrometheusSink("m")
    update_engine_gauges(_stats(), sink)
    update_engine_gauges(_stats(kv_blocks_total=80, kv_blocks_free=80), sink)
    info = [s for s in _samples(sink.exposition()[0].decode()) if s.name == metrics.PICKER_CACHE_INFO]
    assert [(s.labels["num_gpu_blocks"], s.value) for s in info] == [("80", 1.0)]


def test_stats_without_block_size_leave_the_cache_info_out():
    sink = PrometheusSink("m")
    update_engine_gauges({k: v for k, v in _stats().items() if k != "block_size"}, sink)
    names = {s.name for s in _samples(sink.exposition()[0].decode())}
    assert "vllm:num_requests_waiting" in names and metrics.PICKER_CACHE_INFO not in names


class _Metric:
    def __init__(self, family, labels, buckets=None):
        self.family, self.labels, self.value = family, labels, None
        family.live.add(self)  # weakly: a Metric that is garbage collected leaves the family, as there

    def set(self, value):
        self.value = value

    def increment(self, value):
        self.value = (self.value or 0) + value

    def observe(self, value):
        pass


class _Family:
    HISTOGRAM, COUNTER, GAUGE = "histogram", "counter", "gauge"
    created: dict = {}

    def __init__(self, name, description, kind):
        self.name, self.kind, self.live = name, kind, weakref.WeakSet()
        _Family.created[name] = self

    def Metric(self, labels, buckets=None):  # noqa: N802 (pb_utils' name)
        return _Metric(self, labels, buckets)


class _Pb:
    MetricFamily = _Family


def test_triton_exporter_mirrors_the_gauges_with_triton_labels():
    _Family.created = {}
    sink = TritonMetricsSink(_Pb, {"model": "llm", "version": "1"})
    update_engine_gauges(_stats(), sink)
    update_engine_gauges(_stats(kv_blocks_total=64, kv_blocks_free=64), sink)
    fams = _Family.created
    for alias, name in metrics.PICKER_GAUGES.items():
        assert fams[alias].kind == "gauge"
        [m] = list(fams[alias].live)
        assert m.labels == {"model": "llm", "version": "1"} and m.value == next(iter(fams[name].live)).value
    [info] = list(fams[metrics.PICKER_CACHE_INFO].live)
    assert info.labels == {"model": "llm", "version": "1", "block_size": "16", "num_gpu_blocks": "64"}
    assert info.value == 1
