"""Tensor parallelism over two GPUs (NCCL, CUDA graphs per rank). Skips with fewer than two GPUs."""
import pytest
import torch

from tritongen import LLM, SamplingParams

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]

PROMPTS = [[1, 2, 3, 4, 5], list(range(100, 160)), [7] * 3, list(range(2000, 2031))]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=0)


@pytest.mark.parametrize("enforce_eager", [False, True])  # graphs with NCCL inside, and eager
def test_tp2_float32_equals_tp1_on_cuda(enforce_eager: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    kw = dict(dtype="float32", device="cuda", num_blocks=256, enforce_eager=enforce_eager)
    with LLM("dummy:tiny-llama", **kw) as one:
        single = one.generate(PROMPTS, GREEDY)
    with LLM("dummy:tiny-llama", tensor_parallel_size=2, **kw) as two:
        assert (two.engine.runner.runner.graphs is None) == enforce_eager
        # Decode all-reduces go through symmetric memory (parallel.symmetric) in the first engine of
        # the process, NCCL in later ones (their rendezvous hung): both must agree with TP=1.
        symmetric = two.engine.runner.runner.shard.symmetric is not None
        print(f"symmetric-memory all-reduce: {symmetric}")
        split = two.generate(PROMPTS, GREEDY)
    for a, b in zip(single, split):
        assert a.token_ids == b.token_ids
        diff = max(abs(x.logprob - y.logprob) for x, y in zip(a.logprobs, b.logprobs))
        print(f"max |dlogprob| tp2 vs tp1 fp32 cuda (eager={enforce_eager}): {diff:.2e}")
        assert diff < 1e-3
