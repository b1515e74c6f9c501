"""deploy/grafana/tritongen.json: every query names a series our servers export."""
import json

import httpx

from oai_helpers import DASHBOARD, dashboard_metric_names, exported_series
from tritongen import metrics

# Per-model series of Triton 2.51 (the version the nvidia-pytriton wheel ships); the test of the
# Java client against a real tritonserver checks them on its metrics port.
TRITON_SERIES = {
    "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
    "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us", "nv_inference_pending_request_count",
}


def tritongen_series() -> set[str]:
    hist = {f"{n}_{s}" for n in metrics.HISTOGRAMS for s in ("bucket", "sum", "count")}
    return hist | set(metrics.COUNTERS) | set(metrics.GAUGES)


def test_dashboard_is_valid_grafana_json():
    d = json.loads(DASHBOARD.read_text())
    assert d["uid"] and d["panels"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        assert p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"])
    titles = " ".join(p["title"].lower() for p in d["panels"])
    for topic in ("first token", "per output token", "throughput", "running", "kv cache", "failures"):
        assert topic in titles


def test_every_query_names_an_exported_series_and_every_metric_is_shown():
    used = dashboard_metric_names()
    unknown = used - tritongen_series() - TRITON_SERIES
    assert not unknown, f"dashboard reads series nobody exports: {sorted(unknown)}"
    base = {n.rsplit("_", 1)[0] if n.endswith(("_bucket", "_sum", "_count")) else n for n in used}
    missing = (set(metrics.HISTOGRAMS) | set(metrics.COUNTERS) | set(metrics.GAUGES)) - base
    assert not missing, f"metrics.py names not on the dashboard: {sorted(missing)}"


def test_openai_server_exports_every_tritongen_series_the_dashboard_reads(client, server):
    from oai_helpers import MODEL

    client.completions.create(model=MODEL, prompt="fill the histograms", max_tokens=3)
    exported = exported_series(httpx.get(server.url + "/metrics").text)
    wanted = {n for n in dashboard_metric_names() if n.startswith("tritongen_")}
    assert wanted <= exported, sorted(wanted - exported)
