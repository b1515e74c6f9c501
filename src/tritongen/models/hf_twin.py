"""HF transformers twins of our models: the ground truth for parity tests and `eval parity`."""
from __future__ import annotations

from dataclasses import replace

import torch

from tritongen.models.arch import ModelArch


def twin_arch(arch: ModelArch) -> ModelArch:
    """The arch of the transformers class that computes what `arch` does: itself, except for
    Baichuan (remote code only, never run here), whose 7B is Llama once W_pack is split and the
    NormHead normalized (both done at load). Its 13B (ALiBi) has no such class: ValueError."""
    if arch.architecture != "BaichuanForCausalLM":
        return arch
    if arch.position_encoding != "rope":
        raise ValueError("no HF transformers class computes Baichuan's ALiBi (13B) layout (its remote code is "
                         "never run); its parity reference is tests/models/test_dense_families.py")
    return replace(arch, architecture="LlamaForCausalLM", normalized_lm_head=False)


def hf_twin(model: torch.nn.Module, arch: ModelArch, attn_implementation: str = "eager") -> torch.nn.Module:
    """An HF model of the same architecture (twin_arch) holding exactly our weights
    (CausalLM.hf_state_dict gives them HF's names and layouts)."""
    import transformers

    d = twin_arch(arch).to_hf_config()
    config = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    param = next(model.parameters())
    hf = transformers.AutoModelForCausalLM.from_config(config, dtype=param.dtype,
                                                       attn_implementation=attn_implementation)
    hf.load_state_dict(model.hf_state_dict(), strict=True)
    return hf.to(param.device).eval()


@torch.no_grad()
def hf_greedy(hf: torch.nn.Module, prompt: list[int], max_new_tokens: int,
              eos_token_id: int | None = None) -> tuple[list[int], list[float]]:
    """HF generate (greedy), one prompt: generated ids and the log_softmax of each chosen token."""
    device = next(hf.parameters()).device
    out = hf.generate(torch.tensor([prompt], device=device), do_sample=False, max_new_tokens=max_new_tokens,
                      eos_token_id=eos_token_id, pad_token_id=0, return_dict_in_generate=True,
                      output_logits=True, top_k=None, top_p=None, temperature=None)
    ids = out.sequences[0, len(prompt):].tolist()
    logprobs = [float(torch.log_softmax(step[0].float(), dim=-1)[t]) for step, t in zip(out.logits, ids)]
    return ids, logprobs
