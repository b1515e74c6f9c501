"""PNG plots of `bench serve` runs (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tritongen.bench.results import RequestRecord


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def require_matplotlib() -> None:
    """Import matplotlib now, so that a missing one is reported before the benchmark runs, not after."""
    _pyplot()


def _latency_series(records: list[RequestRecord]) -> dict[str, list[float]]:
    ok = [r for r in records if r.ok]
    return {
        "TTFT": [r.ttft * 1e3 for r in ok if r.ttft is not None],
        "TPOT": [r.tpot * 1e3 for r in ok if r.tpot is not None],
        "ITL": [g * 1e3 for r in ok for g in r.itl],
        "E2E latency": [r.latency * 1e3 for r in ok],
    }


def plot_latency_cdfs(runs: list[tuple[str, list[RequestRecord]]], out_dir: Path) -> list[Path]:
    """One PNG per metric (TTFT, TPOT, ITL, E2E): the empirical CDF of every run on one axis."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    names = ("TTFT", "TPOT", "ITL", "E2E latency")
    for name in names:
        fig, ax = plt.subplots(figsize=(6, 4))
        for label, records in runs:
            values = np.sort(np.asarray(_latency_series(records)[name]))
            if values.size:
                ax.step(values, np.arange(1, values.size + 1) / values.size, where="post", label=label)
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of requests" if name != "ITL" else "fraction of gaps")
        ax.set_title(f"{name} CDF")
        ax.grid(alpha=0.3)
        if runs:
            ax.legend()
        path = out_dir / f"cdf_{name.split()[0].lower()}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_sweep(summaries: list[dict], out_dir: Path) -> Path:
    """Output tok/s and mean TTFT/TPOT against concurrency (a --concurrency 1,8,32,128 sweep)."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    xs = [s["concurrency"] for s in summaries]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(xs, [s["output_tok_s"] for s in summaries], "o-", label="output tok/s")
    ax1.plot(xs, [s["total_tok_s"] for s in summaries], "s--", label="total tok/s")
    ax1.set_xlabel("concurrency")
    ax1.set_ylabel("tokens/s")
    ax1.set_title("throughput vs concurrency")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
        ax2.plot(xs, [s[key]["p50"] if s[key]["p50"] is not None else np.nan for s in summaries], "o-",
                 label=f"{label} p50")
    ax2.set_xlabel("concurrency")
    ax2.set_ylabel("ms")
    ax2.set_title("latency vs concurrency")
    ax1.legend()
    ax2.legend()
    fig.tight_layout()
    path = out_dir / "throughput_vs_concurrency.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
