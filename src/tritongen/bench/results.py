"""Per-request records of a benchmark run and the summary every bench command prints.

Definitions (docs/bench.md repeats them):
  TTFT   time from sending a request to its first output chunk.
  TPOT   (latency - TTFT) / (output tokens - 1), per request; requests with one token have none.
  ITL    every gap between consecutive output chunks, over all requests.
  E2E    latency: sending the request to its last chunk.
  goodput  requests per second that met every SLO of --goodput (ttft, tpot, e2e; milliseconds).
Percentiles are numpy's linear interpolation; times are reported in milliseconds.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np

PERCENTILES = (50, 90, 99)
SLO_KEYS = ("ttft", "tpot", "e2e")


@dataclass
class RequestRecord:
    """What happened to one request; times in seconds."""

    index: int
    """Position of the request in the dataset."""
    prompt_len: int
    output_len: int
    """Output tokens asked for."""
    start: float = 0.0
    """Send time, relative to the start of the run."""
    ttft: Optional[float] = None
    latency: Optional[float] = None
    itl: list[float] = field(default_factory=list)
    """Gaps between consecutive output chunks."""
    num_output_tokens: int = 0
    """Output tokens received (as the server reports them, else as counted or asked for)."""
    error: Optional[str] = None
    streamed: bool = True
    """False for non-streaming targets: the whole output arrives at once, so there is no TPOT."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.latency is not None

    @property
    def tpot(self) -> Optional[float]:
        if not self.ok or not self.streamed or self.ttft is None or self.num_output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.num_output_tokens - 1)


def parse_goodput(spec: Optional[str]) -> dict[str, float]:
    """"ttft:500,tpot:50" -> {"ttft": 0.5, "tpot": 0.05} (SLOs in seconds)."""
    if not spec:
        return {}
    slos = {}
    for part in spec.split(","):
        key, _, value = part.partition(":")
        key = key.strip().lower()
        if key not in SLO_KEYS or not value:
            raise ValueError(f"bad --goodput part {part!r}; expected e.g. ttft:500,tpot:50 (milliseconds)")
        slos[key] = float(value) / 1000.0
    return slos


def meets_slos(rec: RequestRecord, slos: dict[str, float]) -> bool:
    if not rec.ok:
        return False
    values = {"ttft": rec.ttft, "tpot": rec.tpot, "e2e": rec.latency}
    for key, limit in slos.items():
        if values[key] is None:
            if key == "tpot":
                continue  # a one-token request has no TPOT, so it cannot violate a TPOT SLO
            return False
        if values[key] > limit:
            return False
    return True


def stats_ms(values: list[float]) -> dict[str, Optional[float]]:
    """mean and percentiles of seconds, in milliseconds (None when there are no values)."""
    if not values:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    a = np.asarray(values, dtype=np.float64) * 1000.0
    return {"mean": float(a.mean()), **{f"p{p}": float(np.percentile(a, p)) for p in PERCENTILES}}


def summarize(records: list[RequestRecord], elapsed: float, label: dict,
              slos: Optional[dict[str, float]] = None) -> dict:
    """The summary dict of one run; `label` names the run (target, concurrency or rate, ...)."""
    done = [r for r in records if r.ok]
    prompt_tokens = sum(r.prompt_len for r in done)
    completion_tokens = sum(r.num_output_tokens for r in done)
    elapsed = max(elapsed, 1e-9)
    summary = dict(label)
    summary.update({
        "num_requests": len(records),
        "completed": len(done),
        "errors": len(records) - len(done),
        "elapsed_time": elapsed,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "rps": len(done) / elapsed,
        "rpm": 60.0 * len(done) / elapsed,
        "output_tok_s": completion_tokens / elapsed,
        "total_tok_s": (prompt_tokens + completion_tokens) / elapsed,
        "ttft_ms": stats_ms([r.ttft for r in done if r.ttft is not None]),
        "tpot_ms": stats_ms([r.tpot for r in done if r.tpot is not None]),
        "itl_ms": stats_ms([g for r in done for g in r.itl]),
        "e2e_ms": stats_ms([r.latency for r in done]),
    })
    if slos:
        good = sum(meets_slos(r, slos) for r in records)
        summary["goodput"] = {"slo_ms": {k: v * 1000 for k, v in slos.items()}, "good_requests": good,
                              "rps": good / elapsed}
    first_error = next((r.error for r in records if r.error), None)
    if first_error:
        summary["first_error"] = first_error
    return summary


def _fmt(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}"


def format_summary(s: dict) -> str:
    """The human-readable block (the seed's lines first, then throughput and latency tables)."""
    lines = ["=" * 20 + " tritongen bench " + "=" * 20]
    for key in ("target", "model", "dataset", "concurrency", "request_rate", "burstiness"):
        if s.get(key) is not None:
            lines.append(f"{key:<32}{s[key]}")
    lines += [
        f"{'elapsed_time':<32}{s['elapsed_time']:.2f} s",
        f"{'number of prompt tokens':<32}{s['prompt_tokens']}",
        f"{'number of completion tokens':<32}{s['completion_tokens']}",
        f"{'RPS':<32}{s['rps']:.3f}",
        f"{'RPM':<32}{s['rpm']:.1f}",
        f"{'requests completed / errors':<32}{s['completed']} / {s['errors']}",
        f"{'output tok/s':<32}{s['output_tok_s']:.1f}",
        f"{'total tok/s':<32}{s['total_tok_s']:.1f}",
    ]
    if "goodput" in s:
        g = s["goodput"]
        slo = ",".join(f"{k}<={v:g}ms" for k, v in g["slo_ms"].items())
        lines.append(f"{'goodput (req/s)':<32}{g['rps']:.3f}  ({g['good_requests']} met {slo})")
    lines.append(f"{'(ms)':<10}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}")
    for name in ("ttft", "tpot", "itl", "e2e"):
        st = s[f"{name}_ms"]
        lines.append(f"{name.upper():<10}" + "".join(f"{_fmt(st[k]):>10}" for k in ("mean", "p50", "p90", "p99")))
    if s.get("first_error"):
        lines.append(f"first error: {s['first_error']}")
    return "\n".join(lines)


def records_to_json(records: list[RequestRecord]) -> list[dict]:
    return [{**asdict(r), "tpot": r.tpot} for r in records]
