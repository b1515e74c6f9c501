"""One set of metric names for every frontend, and the per-request timing that feeds them.

Pure Python. Each frontend adapts `MetricsSink` to its exporter: prometheus-client in the OpenAI
server, pb_utils.MetricFamily inside Triton. Names and meanings (DESIGN.md, "Metrics"):
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Protocol

from tritongen.types import RequestOutput

PREFIX = "tritongen_"

HISTOGRAMS = {
    "tritongen_time_to_first_token_seconds": "Time from request arrival to its first output token.",
    "tritongen_time_per_output_token_seconds": "Mean gap between output tokens after the first, per request.",
    "tritongen_e2e_request_latency_seconds": "Time from request arrival to its last output.",
}
COUNTERS = {
    "tritongen_prompt_tokens_total": "Prompt tokens of finished requests.",
    "tritongen_generation_tokens_total": "Generated tokens of finished requests.",
    "tritongen_request_success_total": "Finished requests, by finish_reason.",
    "tritongen_num_preemptions_total": "Requests preempted for KV-cache room (blocks freed, recomputed later).",
    "tritongen_engine_steps_total": "Engine steps (forward passes over the running batch).",
    "tritongen_engine_prefill_steps_total": "Engine steps that carried prompt tokens (a prefill or a chunk of "
                                            "one); the decodes batched with them take longer.",
    "tritongen_engine_steps_ahead_total": "Engine steps launched by asynchronous scheduling before the step "
                                          "before them finished.",
    "tritongen_engine_decode_step_seconds_total": "Seconds of engine steps without prompt tokens, each from its "
                                                  "start (launch, or the step before's result) to its result.",
    "tritongen_engine_prefill_step_seconds_total": "Seconds of engine steps that carried prompt tokens, measured "
                                                   "the same way: over tritongen_engine_prefill_steps_total, their "
                                                   "mean length.",
    "tritongen_engine_mixed_graph_steps_total": "Engine steps replayed from a mixed-step CUDA graph "
                                                "(--mixed-cuda-graphs): of the steps that carried prompt tokens, "
                                                "the others ran eagerly.",
    "tritongen_request_rejected_total": "Requests refused at admission (UNAVAILABLE / 503) because the server was "
                                        "full (max_num_seqs running + max_queue waiting).",
    "tritongen_engine_failed_steps_total": "Engine steps that raised: only the requests scheduled in them failed "
                                           "(finish_reason=\"error\").",
    "tritongen_engine_restarts_total": "Times the engine was rebuilt in place after repeated or fatal step failures, "
                                       "or after its process died.",
}
ENGINE_COUNTERS = {  # counter <- the engine stats() key it follows
    "tritongen_num_preemptions_total": "num_preemptions",
    "tritongen_engine_steps_total": "num_steps",
    "tritongen_engine_prefill_steps_total": "num_prefill_steps",
    "tritongen_engine_steps_ahead_total": "num_steps_ahead",
    "tritongen_engine_decode_step_seconds_total": "decode_step_seconds",
    "tritongen_engine_prefill_step_seconds_total": "prefill_step_seconds",
    "tritongen_engine_mixed_graph_steps_total": "num_mixed_graph_steps",
    "tritongen_engine_failed_steps_total": "num_failed_steps",
    "tritongen_engine_restarts_total": "engine_restarts",
}
GAUGES = {
    "tritongen_num_requests_running": "Requests in the running batch.",
    "tritongen_num_requests_waiting": "Requests waiting to be scheduled.",
    "tritongen_kv_cache_usage_ratio": "Fraction of KV-cache blocks in use (0..1).",
    "tritongen_prefix_cache_hit_ratio": "Prompt tokens served from the prefix cache / prompt tokens looked up.",
}

# The KV-cache layout, for routers that mirror the prefix cache (docs/deploy.md, "Routing").
CACHE_GAUGES = {
    "tritongen_kv_cache_block_size": "Tokens per KV-cache block: the prefix cache reuses whole blocks, each "
                                     "identified by a hash chained over every token id before its end.",
    "tritongen_kv_cache_num_blocks": "KV-cache blocks of the engine (its capacity; one block holds block_size tokens).",
}
# What the Gateway API Inference Extension's endpoint picker reads (llm-d-router's
# core-metrics-extractor, engine type "vllm", its default): the same values under vLLM's names.
PICKER_GAUGES = {  # alias -> the tritongen gauge it mirrors
    "vllm:num_requests_waiting": "tritongen_num_requests_waiting",
    "vllm:num_requests_running": "tritongen_num_requests_running",
    "vllm:kv_cache_usage_perc": "tritongen_kv_cache_usage_ratio",
}
PICKER_CACHE_INFO = "vllm:cache_config_info"
"""Value 1; labels block_size and num_gpu_blocks (from CACHE_GAUGES), as the picker parses them."""
CACHE_INFO_LABELS = {"block_size": "tritongen_kv_cache_block_size",
                     "num_gpu_blocks": "tritongen_kv_cache_num_blocks"}


def alias_descriptions() -> dict[str, str]:
    """Description of every picker alias (the exporters register these beside GAUGES)."""
    return {alias: f"{GAUGES[name]} (= {name}; the name the Gateway API Inference Extension reads)"
            for alias, name in PICKER_GAUGES.items()}


def cache_info_labels(values: dict[str, float]) -> Optional[dict[str, str]]:
    """The labels of PICKER_CACHE_INFO from the CACHE_GAUGES values set so far (None before both are)."""
    if not all(name in values for name in CACHE_INFO_LABELS.values()):
        return None
    return {label: str(int(values[name])) for label, name in CACHE_INFO_LABELS.items()}


TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
                0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0)
BUCKETS = {
    "tritongen_time_to_first_token_seconds": TTFT_BUCKETS,
    "tritongen_time_per_output_token_seconds": TPOT_BUCKETS,
    "tritongen_e2e_request_latency_seconds": E2E_BUCKETS,
}


class MetricsSink(Protocol):
    def observe(self, name: str, value: float) -> None: ...
    def increment(self, name: str, value: float, labels: Optional[dict[str, str]] = None) -> None: ...
    def set_gauge(self, name: str, value: float) -> None: ...


@dataclass
class RequestTimer:
    """Feed every RequestOutput of one request; records TTFT/TPOT/e2e/counters when it finishes."""

    arrival: float = field(default_factory=time.monotonic)
    first_token: Optional[float] = None
    num_output_tokens: int = 0

    def on_output(self, out: RequestOutput, sink: MetricsSink) -> None:
        now = time.monotonic()
        if self.first_token is None and out.delta_token_ids:
            self.first_token = now
            sink.observe("tritongen_time_to_first_token_seconds", now - self.arrival)
        self.num_output_tokens = out.num_output_tokens
        if not out.finished:
            return
        sink.observe("tritongen_e2e_request_latency_seconds", now - self.arrival)
        if self.first_token is not None and self.num_output_tokens > 1:
            sink.observe("tritongen_time_per_output_token_seconds",
                         (now - self.first_token) / (self.num_output_tokens - 1))
        sink.increment("tritongen_prompt_tokens_total", out.num_prompt_tokens)
        sink.increment("tritongen_generation_tokens_total", out.num_output_tokens)
        sink.increment("tritongen_request_success_total", 1, {"finish_reason": out.finish_reason or "abort"})


    def on_end(self, finish_reason: str, sink: MetricsSink) -> None:
        """The request ended without a finished output (the client cancelled: "abort"; it failed:
        "error"): counted by its finish reason so that every request is counted once."""
        sink.increment("tritongen_request_success_total", 1, {"finish_reason": finish_reason})


def update_engine_gauges(stats: dict, sink: MetricsSink, seen: Optional[dict[str, float]] = None) -> None:
    """Gauges from AsyncLLM.stats() / LLM.stats(), and the engine's counters advanced by what they
    grew since the last call (`seen` holds the values already counted; one dict per sink)."""
    if seen is not None:
        for name, key in ENGINE_COUNTERS.items():
            value = stats.get(key, 0)
            sink.increment(name, max(0, value - seen.get(name, 0)))  # also creates the series at 0
            seen[name] = value
    sink.set_gauge("tritongen_num_requests_running", stats["num_running"])
    sink.set_gauge("tritongen_num_requests_waiting", stats["num_waiting"])
    total = stats["kv_blocks_total"] or 1
    sink.set_gauge("tritongen_kv_cache_usage_ratio", 1.0 - stats["kv_blocks_free"] / total)
    sink.set_gauge("tritongen_prefix_cache_hit_ratio", stats["prefix_cache_hit_rate"])
    if "block_size" in stats:
        sink.set_gauge("tritongen_kv_cache_block_size", stats["block_size"])
        sink.set_gauge("tritongen_kv_cache_num_blocks", stats["kv_blocks_total"])
