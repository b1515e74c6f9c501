"""benchmarks/gpu_suite.py on the CPU (--smoke): the code path the GPU run takes, at tiny sizes."""
import json
import os
import subprocess
import sys
from pathlib import Path

from tritongen.bench.gpu_suite_workloads import _pytest_counts, _serving_rows

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_roofline_and_bs1_write_positive_rows(tmp_path):
    out = tmp_path / "suite.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "benchmarks/gpu_suite.py", "--smoke", "--sections", "roofline,bs1",
                           "--json-out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "goals met" in proc.stdout
    res = json.loads(out.read_text())
    assert set(res["sections"]) == {"roofline", "bs1"}
    rows = {r["name"]: r for r in res["rows"]}
    assert rows["copy bandwidth (read+write)"]["ours"] > 0
    assert rows["float32 GEMM 256^3"]["ours"] > 0
    bs1 = rows["bs1 tiny-llama tok/s (16/8, e2e)"]
    assert bs1["ours"] > 0 and bs1["peer"] > 0 and bs1["fraction"] > 0 and bs1["met"] in (True, False)
    assert res["sections"]["bs1"]["dummy:tiny-llama"]["peer_hf_generate"]["output_len"] == 8
    assert res["hardware"]["source"].startswith("measured")


def test_serving_rows_apply_the_issue_goals():
    rows = [{"target": "openai", "rps": 20.0, "rpm": 1200, "tpot_p50_ms": 10.0, "tpot_p99_ms": 20.0},
            {"target": "triton-grpc", "rps": 19.8, "tpot_p50_ms": 10.0},
            {"target": "triton-bls", "rps": 18.0, "tpot_p50_ms": 30.0}]
    got = {r.name: r for r in _serving_rows(rows, "dummy:llama-2-13b", floor_ms=10.0)}
    assert got["serve openai llama-2-13b RPS"].met is True  # only the 13B >= 20 RPS goal
    grpc = got["serve triton-grpc llama-2-13b RPS"]
    assert grpc.ratio == 19.8 / 20.0 and grpc.met is False  # 0.99x openai, but under 20 RPS
    assert got["serve triton-bls llama-2-13b TPOT p50"].met is False  # 30 ms > 2 x 10 ms
    assert got["serve triton-grpc llama-2-13b TPOT p50"].fraction == 1.0


def test_pytest_counts_reads_the_summary_line():
    text = "....F.s\n=== 5 passed, 1 failed, 1 skipped, 2 deselected in 3.1s ==="
    assert _pytest_counts(text) == {"passed": 5, "failed": 1, "skipped": 1, "errors": 0, "deselected": 2}
