"""Check, on the GPU machine, that the carried vLLM generates: a tiny random Llama (head_dim 128,
the 7B's) saved by transformers, run by vllm.LLM from token ids (no tokenizer), greedy, eager
(no torch.compile: this checks the install, not the speed). Prints the tokens and the attention
backend vLLM picked. Run by install_vllm.sh; PYTHONPATH must reach the vLLM site.
"""
from __future__ import annotations

import sys
import tempfile
import time


def tiny_llama(path: str) -> None:
    import torch
    import transformers

    config = transformers.LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                                      bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)


def main() -> int:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with tempfile.TemporaryDirectory(prefix="vllm-smoke-") as path:
        tiny_llama(path)
        t0 = time.monotonic()
        llm = LLM(model=path, skip_tokenizer_init=True, enforce_eager=True, dtype="bfloat16", seed=0,
                  gpu_memory_utilization=0.2, max_model_len=256)
        start_s = time.monotonic() - t0
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, detokenize=False)
        outs = llm.generate([TokensPrompt(prompt_token_ids=[1, 5, 9, 13, 17])], params, use_tqdm=False)
        ids = list(outs[0].outputs[0].token_ids)
    backend = "?"
    try:  # where vLLM records the backend it selected (its log says it too: "Using ... backend")
        from vllm.v1.attention.backends import fa_utils

        backend = f"FlashAttention version {fa_utils.get_flash_attn_version()}"
    except Exception as exc:  # noqa: BLE001 - only informative
        backend = f"unknown ({type(exc).__name__})"
    print(f"vllm smoke: started in {start_s:.1f} s, generated {ids}; {backend}")
    if len(ids) != 8:
        print(f"vllm smoke FAILED: {len(ids)} tokens, expected 8", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
