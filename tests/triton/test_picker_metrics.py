"""On a real tritonserver's metrics port: the names the Gateway API Inference Extension's endpoint
picker reads (vllm:* aliases, with a colon, through pb_utils.MetricFamily) beside tritongen_*."""
import urllib.request

from triton_helpers import generate

from tritongen import metrics
from tritongen.bench.routing import parse_picker_metrics


def test_picker_names_on_the_metrics_port(triton):
    generate(triton.http, "llm", {"text_input": "route me", "max_tokens": 2})
    body = urllib.request.urlopen(triton.metrics).read().decode()
    for alias in metrics.PICKER_GAUGES:
        assert f'{alias}{{model="llm",version="1"}}' in body, alias
    state = parse_picker_metrics(triton.metrics, body)
    assert state.block_size == metric_value(body, "tritongen_kv_cache_block_size") > 0
    assert state.num_gpu_blocks == metric_value(body, "tritongen_kv_cache_num_blocks") > 0
    assert 0.0 <= state.kv_usage <= 1.0


def metric_value(body: str, name: str) -> int:
    for line in body.splitlines():
        if line.startswith(name + "{") and 'model="llm"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError(f"{name} not exported")
