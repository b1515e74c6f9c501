"""MetricsSink over pb_utils.MetricFamily: the shared tritongen_* names on Triton's metrics port,
and the picker aliases (metrics.PICKER_GAUGES, vllm:*) with the same {model, version} labels, as
Triton's vllm_backend labels its vllm:* series."""
from __future__ import annotations

from typing import Optional

from tritongen import metrics
from tritongen.metrics import BUCKETS, CACHE_GAUGES, COUNTERS, GAUGES, HISTOGRAMS


class TritonMetricsSink:
    """Every metric carries the model's labels ({model, version}); counters may add their own."""

    def __init__(self, pb, labels: dict[str, str]) -> None:
        self._labels = dict(labels)
        kinds = pb.MetricFamily
        aliases = metrics.alias_descriptions()
        info = {metrics.PICKER_CACHE_INFO: "KV-cache configuration (value 1): block_size in tokens, num_gpu_blocks"}
        # A family must outlive its metrics (Triton refuses to update an orphaned metric).
        self._families = {name: pb.MetricFamily(name=name, description=doc, kind=kind)
                          for group, kind in ((HISTOGRAMS, kinds.HISTOGRAM), (COUNTERS, kinds.COUNTER),
                                              (GAUGES, kinds.GAUGE), (CACHE_GAUGES, kinds.GAUGE),
                                              (aliases, kinds.GAUGE), (info, kinds.GAUGE))
                          for name, doc in group.items()}
        self._histograms = {name: self._families[name].Metric(labels=self._labels, buckets=list(BUCKETS[name]))
                            for name in HISTOGRAMS}
        self._counters: dict[tuple, object] = {}
        self._gauges = {name: self._families[name].Metric(labels=self._labels) for name in (*GAUGES, *CACHE_GAUGES)}
        self._aliases: dict[str, list] = {}
        for alias, name in metrics.PICKER_GAUGES.items():
            self._aliases.setdefault(name, []).append(self._families[alias].Metric(labels=self._labels))
        self._gauge_values: dict[str, float] = {}
        # The admission counter exists at 0 before the first refusal (the fronts count it, not the engine).
        self.increment("tritongen_request_rejected_total", 0)
        self._cache_info = None
        self._cache_labels: Optional[dict[str, str]] = None

    def observe(self, name: str, value: float) -> None:
        self._histograms[name].observe(value)

    def increment(self, name: str, value: float, labels: Optional[dict[str, str]] = None) -> None:
        key = (name, tuple(sorted((labels or {}).items())))
        metric = self._counters.get(key)
        if metric is None:
            metric = self._families[name].Metric(labels={**self._labels, **(labels or {})})
            self._counters[key] = metric
        metric.increment(value)

    def set_gauge(self, name: str, value: float) -> None:
        if self._gauge_values.get(name) == value:
            return  # each update is a message to the server process; skip the unchanged ones
        self._gauge_values[name] = value
        self._gauges[name].set(value)
        for alias in self._aliases.get(name, ()):
            alias.set(value)
        if name in CACHE_GAUGES:
            self._set_cache_info(metrics.cache_info_labels(self._gauge_values))

    def _set_cache_info(self, labels: Optional[dict[str, str]]) -> None:
        if labels is None or labels == self._cache_labels:
            return
        # The previous series (if any) goes with its Metric object: one series, the configuration in force.
        self._cache_labels = labels
        self._cache_info = self._families[metrics.PICKER_CACHE_INFO].Metric(labels={**self._labels, **labels})
        self._cache_info.set(1)
