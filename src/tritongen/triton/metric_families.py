"""MetricsSink over pb_utils.MetricFamily: the shared tritongen_* names on Triton's metrics port."""
from __future__ import annotations

from typing import Optional

from tritongen.metrics import BUCKETS, COUNTERS, GAUGES, HISTOGRAMS


class TritonMetricsSink:
    """Every metric carries the model's labels ({model, version}); counters may add their own."""

    def __init__(self, pb, labels: dict[str, str]) -> None:
        self._labels = dict(labels)
        kinds = pb.MetricFamily
        # A family must outlive its metrics (Triton refuses to update an orphaned metric).
        self._families = {name: pb.MetricFamily(name=name, description=doc, kind=kind)
                          for group, kind in ((HISTOGRAMS, kinds.HISTOGRAM), (COUNTERS, kinds.COUNTER),
                                              (GAUGES, kinds.GAUGE))
                          for name, doc in group.items()}
        self._histograms = {name: self._families[name].Metric(labels=self._labels, buckets=list(BUCKETS[name]))
                            for name in HISTOGRAMS}
        self._counters: dict[tuple, object] = {}
        self._gauges = {name: self._families[name].Metric(labels=self._labels) for name in GAUGES}
        self._gauge_values: dict[str, float] = {}

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
