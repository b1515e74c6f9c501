"""prompt_logprobs: every prompt token scored exactly as HF's log_softmax, across prefill chunks,
never from the prefix cache, and recomputed prefills after preemption add nothing twice."""
import torch

from tritongen import LLM, SamplingParams
from tritongen.models.hf_twin import hf_twin
from tritongen.core.sequence import Sequence
from tritongen.types import TokenLogprob


def test_prompt_logprobs_equal_hf_log_softmax_across_chunks_and_repeats():
    # A 16-token budget splits the 41-token prompt into three prefill chunks.
    llm = LLM("dummy:tiny-llama", dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=16,
              kv_cache_memory_gb=0.05)
    hf = hf_twin(llm.engine.runner.model, llm.engine.runner.arch)
    prompt = list(range(100, 141))
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
    want = ref[:-1].gather(1, torch.tensor(prompt[1:])[:, None]).squeeze(1)
    for _ in range(2):  # the second run would hit the prefix cache if it were allowed to
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3))[0]
        assert out.num_cached_tokens == 0
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
        assert [lp.token_id for lp in out.prompt_logprobs[1:]] == prompt[1:]
        ours = torch.tensor([lp.logprob for lp in out.prompt_logprobs[1:]])
        torch.testing.assert_close(ours, want, atol=1e-5, rtol=0)
        top_lp, top_ids = ref[9].topk(3)
        assert [t for t, _ in out.prompt_logprobs[10].top] == top_ids.tolist()
    plain = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2))[0]
    assert plain.prompt_logprobs is None and plain.token_ids == out.token_ids


def test_recomputed_prefill_adds_no_duplicates():
    seq = Sequence("r", [1, 2, 3, 4, 5], SamplingParams(prompt_logprobs=0))
    lp = [TokenLogprob(t, -float(t)) for t in (2, 3, 4, 5)]
    seq.add_prompt_logprobs(0, lp[:2])      # chunk [0, 2)
    seq.add_prompt_logprobs(0, lp)          # recompute after preemption: [0, 5)
    seq.add_prompt_logprobs(2, lp[2:])      # an overlapping late chunk changes nothing
    assert [x.token_id for x in seq.prompt_logprobs[1:]] == [2, 3, 4, 5]
