"""FP8 checkpoints in both published formats: ours (models/fp8_writer.py) and compressed-tensors'
own compressor write them; transformers reads both back (dequantizing), and its weights equal our
dequantization of the stored tensors bit for bit."""
import json

import pytest
import torch
from safetensors import safe_open

from tritongen.models.fp8_checkpoint import checkpoint_name, checkpoint_scale, plan_for
from tritongen.models.fp8_writer import write_fp8_checkpoint
from tritongen.ops.fp8 import E4M3, Fp8Scales, dequantize_weight

transformers = pytest.importorskip("transformers")
LAYOUTS = {"channel": Fp8Scales("channel"), "tensor": Fp8Scales("tensor"), "block": Fp8Scales("block", (32, 32))}  # dims divide, as in published ones


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory):
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("bf16")
    transformers.LlamaForCausalLM(cfg).save_pretrained(out)
    return out


def _tensors(path):
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _hf_dequantized(path, fmt):
    if fmt == "hf-fp8":
        pytest.importorskip("accelerate")
        qc = transformers.FineGrainedFP8Config(dequantize=True)
    else:
        pytest.importorskip("compressed_tensors")
        qc = transformers.CompressedTensorsConfig(run_compressed=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, quantization_config=qc, dtype=torch.float32)
    return {k: v.detach() for k, v in model.state_dict().items()}


def _ours_dequantized(path):
    config = json.loads((path / "config.json").read_text())
    plan = plan_for(config, None)
    raw = _tensors(path)
    out = {}
    for name, t in raw.items():
        if t.dtype == E4M3:
            scale_key = name[: -len("weight")] + plan.scale_suffix
            assert checkpoint_name(scale_key, plan).endswith(".weight_scale")
            scale = checkpoint_scale(raw[scale_key], plan, *t.shape)
            out[name] = dequantize_weight(t, scale, plan.scales)
        elif not name.endswith(plan.scale_suffix):
            out[name] = t.float()
    return out


@pytest.mark.parametrize("fmt, layout", [("hf-fp8", "block"), ("compressed-tensors", "channel"),
                                         ("compressed-tensors", "tensor"), ("compressed-tensors", "block")])
def test_written_checkpoints_dequantize_in_transformers_exactly_as_ours(bf16_dir, tmp_path, fmt, layout):
    out = write_fp8_checkpoint(bf16_dir, tmp_path / "fp8", fmt, LAYOUTS[layout])
    stored = _tensors(out)
    assert stored["model.layers.0.self_attn.q_proj.weight"].dtype == E4M3
    assert stored["lm_head.weight"].dtype == torch.float32  # skipped by default
    assert stored["model.embed_tokens.weight"].dtype == torch.float32
    ours, hf = _ours_dequantized(out), _hf_dequantized(out, fmt)
    linear = [k for k in ours if k.endswith("proj.weight")]
    assert len(linear) == 2 * 7
    for key in linear:
        assert torch.equal(ours[key], hf[key].float()), key
    # and the quantization did something, within e4m3's rounding of the original
    original = _tensors(bf16_dir)["model.layers.1.mlp.down_proj.weight"]
    err = (ours["model.layers.1.mlp.down_proj.weight"] - original).abs()
    assert 0 < err.max() <= 2 ** -4 * original.abs().max()


def test_compressed_tensors_own_compressor_writes_what_we_read(bf16_dir, tmp_path):
    """A checkpoint made by the compressed-tensors library itself (FP8_DYNAMIC: channel weights,
    dynamic per-token activations) has the config and tensors our plan reads."""
    ct = pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams

    model = transformers.AutoModelForCausalLM.from_pretrained(bf16_dir)
    scheme = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    for module in model.modules():
        if hasattr(module, "weight_scale"):
            w = module.weight.data
            scale, zp = calculate_qparams(w.amin(1, keepdim=True), w.amax(1, keepdim=True), scheme.weights)
            module.weight_scale.data.copy_(scale)
            module.weight_zero_point.data.copy_(zp)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="float-quantized")
    compressor.compress_model(model)
    model.save_pretrained(tmp_path / "ct")
    compressor.update_config(tmp_path / "ct")
    config = json.loads((tmp_path / "ct" / "config.json").read_text())
    plan = plan_for(config, None)
    assert plan.scales == Fp8Scales("channel") and plan.skips("lm_head"), ct.__version__
    ours, hf = _ours_dequantized(tmp_path / "ct"), _hf_dequantized(tmp_path / "ct", "compressed-tensors")
    for key in [k for k in ours if k.endswith("proj.weight")]:
        assert torch.equal(ours[key], hf[key].float()), key
    # our writer produces the same tensor names and shapes
    mine = _tensors(write_fp8_checkpoint(bf16_dir, tmp_path / "mine", "compressed-tensors", Fp8Scales("channel")))
    theirs = {k: v for k, v in _tensors(tmp_path / "ct").items() if not k.endswith("zero_point")}
    assert {k: tuple(v.shape) for k, v in mine.items()} == {k: tuple(v.shape) for k, v in theirs.items()}


def test_writer_refuses_bad_input(bf16_dir, tmp_path):
    with pytest.raises(ValueError, match="block scales only"):
        write_fp8_checkpoint(bf16_dir, tmp_path / "x", "hf-fp8", Fp8Scales("channel"))
    with pytest.raises(ValueError, match="format must be one of"):
        write_fp8_checkpoint(bf16_dir, tmp_path / "x", "gguf")
    done = write_fp8_checkpoint(bf16_dir, tmp_path / "once")
    with pytest.raises(ValueError, match="already quantized"):
        write_fp8_checkpoint(done, tmp_path / "twice")
