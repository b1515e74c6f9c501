"""metrics.MetricsSink over prometheus-client, one registry per app (several apps may share a
process, as in tests). Every series carries the served model name as label `model`."""
from __future__ import annotations

from typing import Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tritongen import metrics



class PrometheusSink:
    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self._histograms = {name: Histogram(name, doc, ["model"], buckets=metrics.BUCKETS[name], registry=reg)
                            for name, doc in metrics.HISTOGRAMS.items()}
        self._counters = {name: Counter(name, doc, ["model", "finish_reason"] if "success" in name else ["model"],
                                        registry=reg)
                          for name, doc in metrics.COUNTERS.items()}
        self._counters["tritongen_request_rejected_total"].labels(model=model_name)  # at 0 before the first one
        self._gauges = {name: Gauge(name, doc, ["model"], registry=reg) for name, doc in metrics.GAUGES.items()}
        for g in self._gauges.values():
            g.labels(model=model_name).set(0)

    def observe(self, name: str, value: float) -> None:
        self._histograms[name].labels(model=self.model_name).observe(value)

    def increment(self, name: str, value: float, labels: Optional[dict[str, str]] = None) -> None:
        self._counters[name].labels(model=self.model_name, **(labels or {})).inc(value)

    def set_gauge(self, name: str, value: float) -> None:
        self._gauges[name].labels(model=self.model_name).set(value)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
