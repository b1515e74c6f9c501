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


def test_fp8_weights_halve_the_linear_bytes_but_not_lm_head_and_fp8_kv_halves_the_cache():
    arch = read_arch("dummy:llama-2-7b")
    head = arch.vocab_size * arch.hidden_size
    bf16 = roofline.decode_step_floor(arch, "bfloat16", [256])
    fp8 = roofline.decode_step_floor(arch, "bfloat16", [256], quantization="fp8")
    assert fp8["weight_bytes"] == (bf16["weight_bytes"] - 2 * head) // 2 + 2 * head
    assert fp8["kv_bytes"] == bf16["kv_bytes"]
    kv8 = roofline.decode_step_floor(arch, "bfloat16", [256], quantization="fp8", kv_dtype="fp8")
    assert kv8["kv_bytes"] * 2 == bf16["kv_bytes"]
    assert 0.5 < fp8["floor_s"] / bf16["floor_s"] < 0.53  # lm_head's 262 MB stay bf16
    # Prefill at FP8's doubled tensor-core rate; decode reads fewer bytes.
    pairs = [(512, 64)] * 32
    full = roofline.dataset_floor(arch, "bfloat16", pairs, 32)
    quant = roofline.dataset_floor(arch, "bfloat16", pairs, 32, quantization="fp8")
    assert 0.5 < quant["prefill_s"] / full["prefill_s"] < 0.52  # attention stays at the bf16 rate
    assert quant["decode_s"] < 0.75 * full["decode_s"]  # the KV cache (bf16) is a third of the bytes here
    with pytest.raises(ValueError, match="unknown quantization 'int4'"):
        roofline.decode_step_floor(arch, "bfloat16", [1], quantization="int4")


def test_cli_prints_step_and_dataset_floor(capsys):
    assert main(["bench", "roofline", "--model", "dummy:llama-2-7b", "--dtype", "bfloat16", "--context-len", "128",
                 "--measured-ms", "6.24", "--dataset", "random:128:256", "--num-prompts", "4", "--max-batch", "4"]) == 0
    out = capsys.readouterr().out
    assert "decode step floor  3.1" in out and "achieved fraction 0.50" in out and "dataset floor" in out
