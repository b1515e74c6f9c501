"""In-process bench commands on dummy:tiny-llama: offline throughput, decode latency, the HF peer."""
import json

from tritongen.cli import main

ENGINE = ["--model", "dummy:tiny-llama", "--device", "cpu", "--dtype", "float32", "--num-blocks", "64"]


def test_offline_runs_the_dataset_with_exact_output_lengths(tmp_path, capsys):
    out = tmp_path / "offline.json"
    assert main(["bench", "offline", *ENGINE, "--dataset", "random:16:5", "--num-prompts", "4",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "output tok/s" in text and "total tok/s" in text and "requests/s" in text
    s = json.loads(out.read_text())
    assert (s["num_requests"], s["prompt_tokens"], s["completion_tokens"]) == (4, 64, 20)
    assert s["output_tok_s"] > 0 and s["total_tok_s"] > s["output_tok_s"]


def test_latency_reports_decode_steps(tmp_path, capsys):
    out = tmp_path / "lat.json"
    assert main(["bench", "latency", *ENGINE, "--batch-size", "2", "--input-len", "8", "--output-len", "4",
                 "--iters", "1", "--warmup-iters", "0", "--out", str(out)]) == 0
    s = json.loads(out.read_text())
    assert s["decode_step_ms"]["mean"] > 0 and s["decode_tok_s"] > 0
    assert "decode step (ms)" in capsys.readouterr().out


def test_hf_peer_on_the_same_weights(tmp_path, capsys):
    out = tmp_path / "hf.json"
    assert main(["bench", "hf", "--model", "dummy:tiny-llama", "--device", "cpu", "--dtype", "float32",
                 "--dataset", "random:8:3", "--num-prompts", "3", "--input-len", "8", "--output-len", "3",
                 "--iters", "1", "--out", str(out)]) == 0
    s = json.loads(out.read_text())
    assert s["latency"]["tok_s"] > 0
    assert (s["throughput"]["completion_tokens"], s["throughput"]["prompt_tokens"]) == (9, 24)
