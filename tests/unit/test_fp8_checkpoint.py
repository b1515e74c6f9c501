"""models/fp8_checkpoint.py: quantization_config as published checkpoints write it -> the FP8 plan,
and the swap of a model's linear layers."""
import pytest
import torch
from torch import nn

from tritongen.models.fp8_checkpoint import (checkpoint_name, fp8_linear_names, make_fp8_layers, plan_for,
                                             quantize_layers)
from tritongen.ops.fp8 import E4M3, Fp8Linear, Fp8Scales

# The shapes of quantization_config in published checkpoints (HF FineGrainedFP8, llm-compressor's
# FP8_DYNAMIC and FP8_BLOCK schemes).
HF_FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
          "modules_to_not_convert": ["lm_head", "re:.*gate$"]}


def _compressed(strategy: str, **weights) -> dict:
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"],
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
                            "strategy": strategy, **weights},
                "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": True,
                                      "strategy": "token"}}}}


def test_plans_of_each_published_format():
    assert plan_for({}, None) is None
    at_load = plan_for({}, "fp8")
    assert at_load.scales == Fp8Scales("channel") and not at_load.prequantized
    hf = plan_for({"quantization_config": HF_FP8}, None)
    assert hf.scales == Fp8Scales("block", (128, 128)) and hf.scale_suffix == "weight_scale_inv"
    assert hf.skips("lm_head") and hf.skips("model.layers.0.mlp.gate") and not hf.skips("model.layers.0.mlp.gate_proj")
    ch = plan_for({"quantization_config": _compressed("channel")}, "fp8")  # a pre-quantized checkpoint wins
    assert ch.scales == Fp8Scales("channel") and ch.scale_suffix == "weight_scale" and ch.skips("lm_head")
    assert plan_for({"quantization_config": _compressed("tensor")}, None).scales == Fp8Scales("tensor")
    blk = plan_for({"quantization_config": _compressed("block", block_structure=[128, 64])}, None)
    assert blk.scales == Fp8Scales("block", (128, 64))


@pytest.mark.parametrize("config, message", [
    ({"quant_method": "gptq"}, "unsupported quantization_config quant_method 'gptq'"),
    ({**HF_FP8, "activation_scheme": "static"}, "activation_scheme 'static'"),
    ({k: v for k, v in HF_FP8.items() if k != "weight_block_size"}, "without weight_block_size"),
    ({**HF_FP8, "weight_block_size": [128, 0]}, "weight_block_size must be two positive integers"),
    ({**_compressed("channel"), "format": "pack-quantized"}, "format 'pack-quantized'"),
    (_compressed("group"), "weight strategy 'group'"),
    ({**_compressed("channel"), "config_groups": {}}, "0 config_groups"),
], ids=["method", "static", "no-block", "bad-block", "format", "strategy", "groups"])
def test_unsupported_configs_are_refused_naming_the_field(config, message):
    with pytest.raises(ValueError, match=message):
        plan_for({"quantization_config": config}, None)


def test_unknown_quantization_option_is_refused():
    with pytest.raises(ValueError, match="quantization must be one of \\['fp8'\\]"):
        plan_for({}, "int4")


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 16)
        self.mlp = nn.ModuleDict({"up_proj": nn.Linear(16, 32), "down_proj": nn.Linear(32, 16, bias=False),
                                  "gate": nn.Linear(16, 4)})
        self.lm_head = nn.Linear(16, 10, bias=False)


def test_quantize_layers_swaps_the_planned_linears_and_keeps_the_rest():
    torch.manual_seed(0)
    model = _Tiny()
    up = model.mlp["up_proj"].weight.detach().clone()
    plan = plan_for({"quantization_config": HF_FP8}, None)
    names = quantize_layers(model, plan)
    assert names == ["mlp.up_proj", "mlp.down_proj"]
    assert isinstance(model.mlp["up_proj"], Fp8Linear) and model.mlp["up_proj"].weight.dtype == E4M3
    assert type(model.mlp["gate"]) is nn.Linear and type(model.lm_head) is nn.Linear
    x = torch.randn(3, 16)
    err = (model.mlp["up_proj"](x) - (x @ up.t() + model.mlp["up_proj"].bias)).abs().max()
    assert 0 < err < 0.1


def test_make_fp8_layers_builds_empty_layers_on_meta_for_a_checkpoint():
    with torch.device("meta"):
        model = _Tiny()
    plan = plan_for({"quantization_config": _compressed("channel")}, None)
    assert make_fp8_layers(model, plan) == ["mlp.up_proj", "mlp.down_proj", "mlp.gate"]
    layer = model.mlp["down_proj"]
    assert layer.weight.is_meta and layer.weight.dtype == E4M3 and tuple(layer.weight_scale.shape) == (16,)
    assert fp8_linear_names(model, plan) == []  # nothing plain left to quantize
    assert checkpoint_name("mlp.up_proj.weight_scale", plan) == "mlp.up_proj.weight_scale"
    hf = plan_for({"quantization_config": HF_FP8}, None)
    assert checkpoint_name("mlp.up_proj.weight_scale_inv", hf) == "mlp.up_proj.weight_scale"
    assert checkpoint_name("mlp.up_proj.weight", hf) == "mlp.up_proj.weight"


def test_quantize_lm_head_leaves_no_layer_out_and_is_refused_where_it_cannot_apply():
    torch.manual_seed(0)
    model = _Tiny()
    plan = plan_for({}, "fp8", quantize_lm_head=True)
    assert not plan.skips("lm_head") and plan_for({}, "fp8").skips("lm_head")
    assert quantize_layers(model, plan) == ["mlp.up_proj", "mlp.down_proj", "mlp.gate", "lm_head"]
    assert isinstance(model.lm_head, Fp8Linear) and type(model.embed) is nn.Embedding
    with pytest.raises(ValueError, match="quantize_lm_head applies to quantization='fp8'.*got quantization=None"):
        plan_for({}, None, quantize_lm_head=True)
    with pytest.raises(ValueError, match="pre-quantized"):
        plan_for({"quantization_config": _compressed("channel")}, "fp8", quantize_lm_head=True)
