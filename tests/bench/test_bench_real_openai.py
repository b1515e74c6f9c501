"""bench serve and eval task against the real OpenAI server (uvicorn in a thread, tiny model)."""
import json

import pytest

pytest.importorskip("tritongen.openai.server")
pytest.importorskip("uvicorn")

from oai_helpers import ServerThread, make_engine  # noqa: E402  (tests/openai, on sys.path via conftest)

from tritongen.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def server():
    from tritongen.openai.server import build_app

    engine = make_engine()
    srv = ServerThread(build_app(engine, served_model_name="dummy:tiny-llama"))
    yield srv
    srv.stop()
    engine.shutdown()


def test_bench_serve_openai_returns_complete_json_without_errors(server, tmp_path, capsys):
    out = tmp_path / "serve.json"
    rc = main(["bench", "serve", "--target", "openai", "--url", server.url, "--model", "dummy:tiny-llama",
               "--dataset", "random:12:6", "--num-prompts", "8", "--concurrency", "4", "--out", str(out),
               "--no-progress"])
    assert rc == 0, capsys.readouterr().out
    (run,) = json.loads(out.read_text())["runs"]
    s = run["summary"]
    assert (s["errors"], s["completed"], s["completion_tokens"], s["prompt_tokens"]) == (0, 8, 48, 96)
    assert s["ttft_ms"]["p50"] > 0 and s["tpot_ms"]["p50"] > 0 and s["itl_ms"]["p99"] >= s["itl_ms"]["p50"]
    assert all(r["num_output_tokens"] == 6 and r["error"] is None for r in run["records"])


def test_builtin_task_scores_the_same_through_engine_and_server(server):
    from tritongen import LLM
    from tritongen.eval.backends import EngineBackend, OpenAIBackend
    from tritongen.eval.task_runner import run_task
    from tritongen.eval.tasks import load_task

    items = load_task("builtin", limit=3) + load_task("builtin:lastword-mc", limit=3)
    engine = EngineBackend(LLM("dummy:tiny-llama", dtype="float32", device="cpu", num_blocks=256))
    remote = OpenAIBackend(server.url, engine.tokenizer)
    try:
        a, b = run_task(engine, items), run_task(remote, items)
    finally:
        remote.close()
    assert [r["correct"] for r in a["items"]] == [r["correct"] for r in b["items"]]
    assert [r.get("output") for r in a["items"]] == [r.get("output") for r in b["items"]]
    for ra, rb in zip(a["items"], b["items"]):
        if ra["kind"] == "multiple_choice":
            assert ra["loglikelihoods"] == pytest.approx(rb["loglikelihoods"], abs=1e-3)
    assert a["summary"]["accuracy"] == b["summary"]["accuracy"]
