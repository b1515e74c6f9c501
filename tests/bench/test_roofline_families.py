"""The roofline's and preflight's parameter counts for every family's shape, against HF's own
classes built from the same config (the bandwidth floor is those bytes over the bandwidth)."""
import pytest
import torch
import transformers

from tritongen import preflight
from tritongen.bench import roofline
from tritongen.models.arch import ModelArch
from tritongen.models.presets import PRESETS

FAMILIES = [name for name in ("tiny-llama", "tiny-qwen3", "tiny-gpt2", "tiny-bloom") if name in PRESETS]
"""Dense families (MoE floors count the routed experts only, elsewhere)."""


@pytest.mark.parametrize("preset", FAMILIES)
def test_parameter_counts_match_hf(preset: str) -> None:
    cfg = dict(PRESETS[preset])
    arch = ModelArch.from_hf_config(cfg)
    hf_config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    hf = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    names = {n for n, _ in hf.named_parameters()}
    expected = sum(p.numel() for p in hf.parameters())
    # Bloom's embedding LayerNorm (2 * hidden) is the one tensor the counts leave out.
    extra = 2 * arch.hidden_size if any("word_embeddings_layernorm" in n for n in names) else 0
    assert preflight.num_params(arch) + extra == expected
    assert roofline.total_params(arch) + extra == expected
