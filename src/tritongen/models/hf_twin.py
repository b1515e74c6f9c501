"""HF transformers twins of our models: the ground truth for parity tests and `eval parity`."""
from __future__ import annotations

import torch

from tritongen.models.arch import ModelArch


NO_HF_CLASS = {"BaichuanForCausalLM": "it ships remote code only, which is never run here; its parity "
                                      "reference is HF Llama with remapped weights (tests/models/test_dense_families.py)"}
"""Architectures without a transformers class, and why."""


def hf_twin(model: torch.nn.Module, arch: ModelArch, attn_implementation: str = "eager") -> torch.nn.Module:
    """An HF model of the same architecture holding exactly our weights (CausalLM.hf_state_dict
    gives them HF's names and layouts)."""
    import transformers

    if arch.architecture in NO_HF_CLASS:
        raise ValueError(f"no HF transformers class for {arch.architecture}: {NO_HF_CLASS[arch.architecture]}")
    d = arch.to_hf_config()
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
