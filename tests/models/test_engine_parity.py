"""The whole engine (batched, paged, sampled) against HF transformers generate, float32 on CPU."""
import pytest
import torch

from tritongen import LLM, SamplingParams
from tritongen.eval.parity import BUILTIN_PROMPTS
from tritongen.models.hf_twin import hf_greedy, hf_twin

PROMPTS_TINY = [[1, 2, 3, 4, 5], list(range(100, 140)), [7] * 3, list(range(2000, 2013))]
SMOL_PROMPTS = BUILTIN_PROMPTS  # the prompts `tritongen eval parity` uses by default


def assert_parity(llm: LLM, hf, prompts: list[list[int]], max_tokens: int, atol: float) -> None:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    outs = llm.generate(prompts, params)
    for prompt, out in zip(prompts, outs):
        ids, lps = hf_greedy(hf, prompt, max_tokens)
        assert out.token_ids == ids
        ours = torch.tensor([lp.logprob for lp in out.logprobs])
        torch.testing.assert_close(ours, torch.tensor(lps), atol=atol, rtol=0)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-llama-mha", "tiny-qwen2", "tiny-mistral", "tiny-llama3"])
def test_tiny_configs_token_identical_with_hf(preset):
    llm = LLM(f"dummy:{preset}", dtype="float32", device="cpu", block_size=4)
    runner = llm.engine.runner
    hf = hf_twin(runner.model, runner.arch)
    assert_parity(llm, hf, PROMPTS_TINY, 24, atol=1e-4)


@pytest.mark.slow
def test_smollm2_8_prompts_32_tokens_token_identical_with_hf(default_model_dir):
    import transformers

    llm = LLM(default_model_dir, dtype="float32", device="cpu")
    tok = llm.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                       tokenize=True)["input_ids"] for p in SMOL_PROMPTS]
    prompts = [list(p) for p in prompts]
    hf = transformers.AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    assert_parity(llm, hf, prompts, 32, atol=1e-4)
