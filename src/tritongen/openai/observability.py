"""metrics.MetricsSink over prometheus-client, one registry per app (several apps may share a
process, as in tests). Every series carries the served model name as label `model`; the picker
aliases (metrics.PICKER_GAUGES, vllm:*) carry it as `model_name`, as vLLM's do."""
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
        gauges = {**metrics.GAUGES, **metrics.CACHE_GAUGES}
        self._gauges = {name: Gauge(name, doc, ["model"], registry=reg) for name, doc in gauges.items()}
        for name in metrics.GAUGES:
            self._gauges[name].labels(model=model_name).set(0)
        self._aliases: dict[str, list] = {}
        for alias, doc in metrics.alias_descriptions().items():
            gauge = Gauge(alias, doc, ["model_name"], registry=reg).labels(model_name=model_name)
            gauge.set(0)
            self._aliases.setdefault(metrics.PICKER_GAUGES[alias], []).append(gauge)
        self._cache_info = Gauge(metrics.PICKER_CACHE_INFO, "KV-cache configuration (value 1): block_size in tokens, "
                                 "num_gpu_blocks", ["model_name", *metrics.CACHE_INFO_LABELS], registry=reg)
        self._cache_values: dict[str, float] = {}
        self._cache_labels: Optional[dict[str, str]] = None

    def observe(self, name: str, value: float) -> None:
        self._histograms[name].labels(model=self.model_name).observe(value)

    def increment(self, name: str, value: float, labels: Optional[dict[str, str]] = None) -> None:
        self._counters[name].labels(model=self.model_name, **(labels or {})).inc(value)

    def set_gauge(self, name: str, value: float) -> None:
        self._gauges[name].labels(model=self.model_name).set(value)
        for alias in self._aliases.get(name, ()):
            alias.set(value)
        if name in metrics.CACHE_GAUGES:
            self._cache_values[name] = value
            self._set_cache_info(metrics.cache_info_labels(self._cache_values))

    def _set_cache_info(self, labels: Optional[dict[str, str]]) -> None:
        if labels is None or labels == self._cache_labels:
            return
        if self._cache_labels is not None:  # one series: the configuration in force
            self._cache_info.remove(self.model_name, *self._cache_labels.values())
        self._cache_labels = labels
        self._cache_info.labels(model_name=self.model_name, **labels).set(1)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
