"""Architecture name (config.json "architectures"[0]) -> our model class (a models.interface.CausalLM)."""
from __future__ import annotations

from torch import nn

from tritongen.models.arch import SUPPORTED_ARCHITECTURES, unsupported_architecture_error
from tritongen.models.baichuan import BaichuanForCausalLM
from tritongen.models.bloom import BloomForCausalLM
from tritongen.models.gemma import GemmaForCausalLM
from tritongen.models.gpt2 import GPT2LMHeadModel
from tritongen.models.llama import LlamaForCausalLM
from tritongen.models.moe import MoEForCausalLM
from tritongen.models.phi3 import Phi3ForCausalLM

# One class covers the whole Llama family; differences (qkv bias, qk-norm, tied embeddings, sliding
# window, rope scaling) are ModelArch fields.
_MODEL_CLASSES: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
    "GPT2LMHeadModel": GPT2LMHeadModel,
    "BloomForCausalLM": BloomForCausalLM,
    "MixtralForCausalLM": MoEForCausalLM,
    "Qwen3MoeForCausalLM": MoEForCausalLM,
    "BaichuanForCausalLM": BaichuanForCausalLM,
    "Gemma2ForCausalLM": GemmaForCausalLM,
    "Gemma3ForCausalLM": GemmaForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
}
assert set(_MODEL_CLASSES) == set(SUPPORTED_ARCHITECTURES)


def get_model_class(arch_name: str) -> type[nn.Module]:
    """The class implementing `arch_name`; ValueError listing the supported ones otherwise."""
    try:
        return _MODEL_CLASSES[arch_name]
    except KeyError:
        raise unsupported_architecture_error(arch_name) from None
