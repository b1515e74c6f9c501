"""Roofline floors from the model shape (DESIGN.md's H200 numbers)."""
import pytest

from tritongen.bench import roofline
from tritongen.cli import main
from tritongen.models.loader import read_arch


def test_llama2_7b_bf16_batch1_step_is_about_3_1_ms():
    arch = read_arch("dummy:llama-2-7b")
    assert roofline.total_params(arch) == pytest.approx(6.74e9, rel=0.01)
    step = roofline.decode_step_floor(arch, "bfloat16", [128])
    assert step["weight_bytes"] == pytest.approx(13.2e9, rel=0.01)  # embedding table is not read whole
    assert 3.1e-3 <= step["floor_s"] <= 3.2e-3
    assert step["bound"] == "memory"
    assert roofline.achieved(step["floor_s"], 2 * step["floor_s"]) == pytest.approx(0.5)


def test_large_batches_become_compute_bound_and_kv_grows_with_context():
    arch = read_arch("dummy:llama-3-8b")
    small = roofline.decode_step_floor(arch, "bfloat16", [512] * 8)
    big = roofline.decode_step_floor(arch, "bfloat16", [16] * 4096)
    assert small["bound"] == "memory" and big["bound"] == "compute"
    assert small["kv_bytes"] == 8 * 512 * roofline.kv_bytes_per_token(arch, "bfloat16")
    assert roofline.kv_bytes_per_token(arch, "bfloat16") == 2 * 32 * 8 * 128 * 2  # GQA: 8 KV heads


def test_dataset_floor_adds_prefill_and_decode():
    arch = read_arch("dummy:llama-2-7b")
    one = roofline.dataset_floor(arch, "bfloat16", [(128, 257)], max_batch=1)
    step = roofline.decode_step_floor(arch, "bfloat16", [128 + 128])  # the average decode context
    assert one["decode_steps"] == 256
    assert one["decode_s"] == pytest.approx(256 * step["floor_s"], rel=0.01)
    many = roofline.dataset_floor(arch, "bfloat16", [(100, 101)] * 64, max_batch=64)
    assert many["decode_steps"] == 100
    assert many["floor_s"] < 64 * one["floor_s"] / 2  # batching amortises the weight reads


def test_cli_prints_step_and_dataset_floor(capsys):
    assert main(["bench", "roofline", "--model", "dummy:llama-2-7b", "--dtype", "bfloat16", "--context-len", "128",
                 "--measured-ms", "6.24", "--dataset", "random:128:256", "--num-prompts", "4", "--max-batch", "4"]) == 0
    out = capsys.readouterr().out
    assert "decode step floor  3.1" in out and "achieved fraction 0.50" in out and "dataset floor" in out
