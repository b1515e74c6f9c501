"""Metric arithmetic on hand-made timelines: TTFT, TPOT, ITL, percentiles, goodput, RPS/RPM."""
import pytest

from tritongen.bench.results import RequestRecord, format_summary, meets_slos, parse_goodput, stats_ms, summarize


def _rec(i, ttft, chunk_gaps, tokens=None, prompt=10, error=None, streamed=True):
    latency = ttft + sum(chunk_gaps)
    n = tokens if tokens is not None else len(chunk_gaps) + 1
    return RequestRecord(i, prompt, n, start=0.0, ttft=ttft, latency=latency, itl=list(chunk_gaps),
                         num_output_tokens=n, error=error, streamed=streamed)


def test_tpot_is_decode_time_over_tokens_after_the_first():
    r = _rec(0, 0.5, [0.1, 0.2, 0.3])  # 4 tokens, latency 1.1
    assert r.latency == pytest.approx(1.1)
    assert r.tpot == pytest.approx(0.6 / 3)
    assert _rec(1, 0.5, [], tokens=1).tpot is None  # one token: no TPOT
    assert _rec(2, 0.5, [0.1], streamed=False).tpot is None
    # Chunks may carry several tokens: TPOT divides by tokens, ITL lists chunk gaps.
    multi = _rec(3, 0.2, [0.4], tokens=5)
    assert multi.tpot == pytest.approx(0.1) and multi.itl == [0.4]


def test_percentiles_are_linear_interpolation_in_ms():
    st = stats_ms([0.001 * v for v in range(1, 101)])  # 1..100 ms
    assert st["mean"] == pytest.approx(50.5)
    assert st["p50"] == pytest.approx(50.5)
    assert st["p90"] == pytest.approx(90.1)
    assert st["p99"] == pytest.approx(99.01)
    assert stats_ms([]) == {"mean": None, "p50": None, "p90": None, "p99": None}


def test_summary_counts_only_completed_requests():
    recs = [_rec(0, 0.1, [0.05, 0.05]), _rec(1, 0.3, [0.1, 0.1, 0.1], prompt=20),
            _rec(2, 0.2, [0.1], error="HTTP 500: boom")]
    s = summarize(recs, elapsed=2.0, label={"target": "openai", "concurrency": 2})
    assert (s["completed"], s["errors"]) == (2, 1)
    assert (s["prompt_tokens"], s["completion_tokens"]) == (30, 7)
    assert s["rps"] == pytest.approx(1.0) and s["rpm"] == pytest.approx(60.0)
    assert s["output_tok_s"] == pytest.approx(3.5) and s["total_tok_s"] == pytest.approx(18.5)
    assert s["ttft_ms"]["mean"] == pytest.approx(200.0)
    assert s["itl_ms"]["mean"] == pytest.approx(80.0)  # 5 gaps: 50, 50, 100, 100, 100
    assert s["tpot_ms"]["mean"] == pytest.approx(75.0)  # 50 and 100
    assert s["e2e_ms"]["p50"] == pytest.approx((200 + 600) / 2)
    assert s["first_error"] == "HTTP 500: boom"
    text = format_summary(s)
    assert "RPM" in text and "60.0" in text and "1 / 1" not in text and "2 / 1" in text


def test_goodput_counts_requests_meeting_every_slo():
    slos = parse_goodput("ttft:250,tpot:80")
    assert slos == {"ttft": 0.25, "tpot": 0.08}
    fast, slow_first, slow_decode = _rec(0, 0.1, [0.05]), _rec(1, 0.3, [0.05]), _rec(2, 0.1, [0.2])
    one_token = _rec(3, 0.1, [], tokens=1)
    failed = _rec(4, 0.1, [0.05], error="x")
    assert [meets_slos(r, slos) for r in (fast, slow_first, slow_decode, one_token, failed)] == \
        [True, False, False, True, False]
    s = summarize([fast, slow_first, slow_decode, one_token, failed], elapsed=4.0, label={}, slos=slos)
    assert s["goodput"]["good_requests"] == 2 and s["goodput"]["rps"] == pytest.approx(0.5)
    assert parse_goodput("e2e:1000") == {"e2e": 1.0}
    with pytest.raises(ValueError, match="goodput"):
        parse_goodput("latency:5")
