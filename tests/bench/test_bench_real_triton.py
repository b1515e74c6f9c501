"""bench serve's triton-grpc target against a real tritonserver (nvidia-pytriton wheel, tiny model)."""
import json
import os

import pytest

pytest.importorskip("grpc")
pytest.importorskip("tritonclient.grpc")

from triton_helpers import TINY, free_ports  # noqa: E402  (tests/triton, on sys.path via conftest)

from tritongen.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def grpc_url(tmp_path_factory, default_model_dir):  # the tiny model speaks the default model's tokenizer
    from tritongen.triton.launcher import TritonServer, find_tritonserver
    from tritongen.triton.repo import write_repository

    try:
        find_tritonserver()
    except FileNotFoundError:
        pytest.skip("tritonserver (nvidia-pytriton) is not installed")
    root = tmp_path_factory.mktemp("triton_bench")
    http, grpc, metrics = free_ports(3)
    server = TritonServer(write_repository(root / "repo", TINY), http_port=http, grpc_port=grpc,
                          metrics_port=metrics, log_file=root / "server.log", exit_timeout_s=30)
    server.start()
    try:
        server.wait_ready(timeout=float(os.environ.get("TRITONGEN_TEST_READY_TIMEOUT", "300")))
        yield server.grpc_url
    finally:
        server.stop()


def _serve(url: str, out, *extra: str) -> tuple[int, dict]:
    rc = main(["bench", "serve", "--target", "triton-grpc", "--url", url, "--dataset", "random:12:6",
               "--num-prompts", "8", "--concurrency", "4", "--out", str(out), "--no-progress", *extra])
    (run,) = json.loads(out.read_text())["runs"]
    return rc, run


def test_bench_serve_triton_grpc_streams_every_token(grpc_url, tmp_path):
    rc, run = _serve(grpc_url, tmp_path / "serve.json")
    s = run["summary"]
    assert rc == 0
    assert (s["errors"], s["completed"], s["completion_tokens"]) == (0, 8, 48), run["records"][0]["error"]
    assert s["ttft_ms"]["p50"] > 0 and s["itl_ms"]["p99"] >= s["itl_ms"]["p50"] > 0
    assert all(r["num_output_tokens"] == 6 and len(r["itl"]) == 5 for r in run["records"])


def test_error_responses_reach_their_requests(grpc_url, tmp_path):
    rc, run = _serve(grpc_url, tmp_path / "bad.json", "--model", "no_such_model")
    assert rc == 1 and run["summary"]["errors"] == 8  # Triton names the request of each error
    assert all("no_such_model" in r["error"] for r in run["records"])
