"""bench serve against a fake OpenAI server: timelines, loops, errors, bounds, JSON and plots."""
import asyncio
import json
import math

import pytest

from fake_servers import FakeOpenAIServer
from tritongen.bench.datasets import BenchRequest
from tritongen.bench.loadgen import LoadShape, run_serve_benchmark
from tritongen.bench.results import summarize
from tritongen.bench.target_kinds import make_target
from tritongen.bench.targets import OpenAITarget
from tritongen.cli import main


def _requests(n: int, out: int = 5, fail: tuple[int, ...] = ()) -> list[BenchRequest]:
    return [BenchRequest("FAIL" if i in fail else f"prompt {i}", 2, out) for i in range(n)]


def _run(url: str, requests, shape: LoadShape, stream: bool = True):
    target = OpenAITarget(url, "m", None, 8, 30.0, stream=stream)
    return asyncio.run(run_serve_benchmark(target, requests, shape, progress=False))


def test_closed_loop_streams_and_records_every_chunk():
    with FakeOpenAIServer(delay=0.01) as srv:
        records, elapsed = _run(srv.url, _requests(8, out=5), LoadShape(concurrency=4))
        body = srv.requests[0]
    assert body["max_tokens"] == body["min_tokens"] == 5 and body["ignore_eos"] and body["stream"]
    assert body["stream_options"] == {"include_usage": True}
    assert [r.index for r in records] == list(range(8))
    for r in records:
        assert r.ok and r.num_output_tokens == 5
        assert len(r.itl) == 4 and 0 < r.ttft < r.latency
        assert r.tpot == pytest.approx((r.latency - r.ttft) / 4)
    s = summarize(records, elapsed, {"target": "openai", "concurrency": 4})
    assert s["errors"] == 0 and s["completion_tokens"] == 40 and s["itl_ms"]["mean"] >= 5


def test_non_streaming_has_no_tpot_and_counts_usage():
    with FakeOpenAIServer(delay=0.002) as srv:
        records, _ = _run(srv.url, _requests(3, out=4), LoadShape(concurrency=2), stream=False)
    assert all(r.ok and r.num_output_tokens == 4 and r.ttft == r.latency and r.tpot is None for r in records)


def test_errors_are_recorded_and_do_not_stop_the_run():
    with FakeOpenAIServer() as srv:
        records, elapsed = _run(srv.url, _requests(6, out=2, fail=(1, 4)), LoadShape(concurrency=3))
    s = summarize(records, elapsed, {})
    assert s["errors"] == 2 and s["completed"] == 4
    assert "HTTP 500" in records[1].error and "asked to fail" in records[1].error


def test_open_loop_poisson_respects_rate_and_cap():
    with FakeOpenAIServer(delay=0.001) as srv:
        records, elapsed = _run(srv.url, _requests(10, out=2),
                                LoadShape(concurrency=2, request_rate=50.0, burstiness=1.0, seed=3))
    starts = [r.start for r in records]
    assert all(r.ok for r in records) and starts == sorted(starts)
    assert 0.05 < elapsed < 5  # about 10 arrivals at 50/s


def test_time_bound_cancels_in_flight_requests():
    with FakeOpenAIServer(delay=0.2) as srv:
        records, elapsed = _run(srv.url, _requests(4, out=50), LoadShape(concurrency=2, max_duration=0.1, grace=0.3))
    assert elapsed < 3
    assert len(records) == 2  # nothing is sent after max_duration
    assert all(r.error and "time limit" in r.error for r in records)


def test_make_target_rejects_unknown_kind():
    with pytest.raises(ValueError, match="triton-grpc"):
        make_target("nope", None, None, None, 1, 1.0)


def test_cli_sweep_writes_json_and_plots(tmp_path, capsys):
    with FakeOpenAIServer(delay=0.002) as srv:
        rc = main(["bench", "serve", "--target", "openai", "--url", srv.url, "--dataset", "random:8:3",
                   "--num-prompts", "6", "--concurrency", "1,3", "--goodput", "ttft:1000,tpot:1000",
                   "--out", str(tmp_path / "r.json"), "--plot", str(tmp_path / "plots"), "--no-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    for line in ("concurrency", "elapsed_time", "number of prompt tokens", "number of completion tokens",
                 "RPS", "RPM", "output tok/s", "total tok/s", "TTFT", "TPOT", "ITL", "goodput"):
        assert line in text
    data = json.loads((tmp_path / "r.json").read_text())
    assert [run["summary"]["concurrency"] for run in data["runs"]] == [1, 3]
    for run in data["runs"]:
        s = run["summary"]
        assert s["errors"] == 0 and s["prompt_tokens"] == 48 and s["completion_tokens"] == 18
        assert s["goodput"]["good_requests"] == 6 and math.isfinite(s["rpm"])
        assert len(run["records"]) == 6 and all(len(r["itl"]) == 2 for r in run["records"])
    pngs = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert pngs == ["cdf_e2e.png", "cdf_itl.png", "cdf_tpot.png", "cdf_ttft.png", "throughput_vs_concurrency.png"]
