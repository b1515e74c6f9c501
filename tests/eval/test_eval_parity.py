"""eval parity: our engine against HF transformers on the same weights."""
import json

import pytest

from tritongen.cli import main
from tritongen.eval.parity import compare, rouge


def test_compare_finds_first_divergence_and_logprob_gap():
    same = compare([1, 2, 3], [-0.1, -0.2, -0.3], [1, 2, 3], [-0.1, -0.2, -0.30001])
    assert same["identical"] and same["first_divergence"] is None and same["matched"] == 3
    assert same["max_abs_dlogprob"] == pytest.approx(1e-5)
    diff = compare([1, 2, 9, 9], [-0.1, -0.2, -0.3, -0.4], [1, 2, 3], [-0.1, -0.25, -1.0])
    assert (diff["matched"], diff["total"], diff["first_divergence"]) == (2, 4, 2)
    assert diff["max_abs_dlogprob"] == pytest.approx(0.05)  # only the common prefix counts


def test_rouge_is_100_for_identical_and_lower_otherwise():
    assert rouge(["the cat sat"], ["the cat sat"]) == {k: 100.0 for k in ("rouge1", "rouge2", "rougeL", "rougeLsum")}
    r = rouge(["the cat sat on the mat"], ["the dog sat on the mat"])
    assert 50 < r["rouge1"] < 100 and r["rouge2"] < r["rouge1"]


def test_tiny_llama_parity_is_100_percent(tmp_path, capsys):
    out = tmp_path / "parity.json"
    rc = main(["eval", "parity", "--model", "dummy:tiny-llama", "--device", "cpu", "--limit", "3",
               "--max-tokens", "12", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "token match: 100.0%" in text and "first divergence: none" in text
    s = json.loads(out.read_text())
    assert s["identical_sequences"] == 3 and s["max_abs_dlogprob"] < 1e-4
    assert s["rouge"]["rougeL"] == 100.0


@pytest.mark.slow
def test_smollm2_float32_parity_is_100_percent(default_model_dir, capsys):
    rc = main(["eval", "parity", "--model", default_model_dir, "--dtype", "float32", "--device", "cpu",
               "--limit", "1", "--max-tokens", "16"])
    text = capsys.readouterr().out
    assert rc == 0 and "token match: 100.0%" in text and "ROUGE-L 100.00" in text


def test_fp8_against_bf16_reports_agreement_and_mean_logprob_gap(tmp_path, capsys):
    out = tmp_path / "fp8.json"
    rc = main(["eval", "parity", "--model", "dummy:tiny-llama", "--device", "cpu", "--limit", "3",
               "--max-tokens", "8", "--quantization", "fp8", "--against", "bf16", "--out", str(out)])
    text = capsys.readouterr().out
    s = json.loads(out.read_text())
    assert s["against"] == "bf16" and s["dtype"] == "float32 fp8" and "against bf16" in text
    assert s["total_tokens"] == 24 and 0 <= s["token_match"] <= 100
    assert 0 < s["mean_abs_dlogprob"] <= s["max_abs_dlogprob"]  # fp8 really changes the logprobs
    assert rc == (0 if s["token_match"] == 100.0 else 1)


def test_against_bf16_without_quantization_is_refused(capsys):
    rc = main(["eval", "parity", "--model", "dummy:tiny-llama", "--device", "cpu", "--against", "bf16"])
    assert rc != 0 and "pass --quantization" in capsys.readouterr().err
