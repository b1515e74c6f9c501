"""`bench hf`: the peer in the same run. HF transformers on the same weights as our engine:
  latency     model.generate at batch 1 (input_len in, output_len out, EOS ignored);
  throughput  the dataset through transformers' continuous batching with paged attention (the
              engine behind generate_batch), each request with its own output length.
Dummy models get an HF twin holding our exact random weights; HF directories load with
from_pretrained. transformers' continuous batching must run outside torch.inference_mode().
"""
from __future__ import annotations

import time

import torch

from tritongen.bench.datasets import BenchRequest
from tritongen.bench.results import stats_ms


def load_hf_model(model: str, dtype: torch.dtype, device: torch.device, seed: int = 0,
                  attn_implementation: str = "sdpa") -> torch.nn.Module:
    """An HF CausalLM for `model`: the twin of our dummy weights, or the checkpoint itself."""
    from tritongen.models.loader import is_dummy, load_model

    if is_dummy(model):
        from tritongen.models.hf_twin import hf_twin

        net, arch = load_model(model, dtype, device, seed=seed)
        hf = hf_twin(net, arch, attn_implementation=attn_implementation)
        del net
        return hf
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=dtype, attn_implementation=attn_implementation)
    return hf.to(device).eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def hf_latency(hf, input_len: int, output_len: int, iters: int = 3, seed: int = 0) -> dict:
    """Batch-1 generate: tokens/s and ms per output token (prefill included, as users see it)."""
    device = next(hf.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    vocab = hf.config.vocab_size
    kwargs = dict(do_sample=False, max_new_tokens=output_len, min_new_tokens=output_len, pad_token_id=0)
    hf.generate(torch.randint(100, vocab, (1, input_len), generator=gen).to(device), **{**kwargs, "max_new_tokens": 2,
                                                                                          "min_new_tokens": 2})
    times = []
    for _ in range(iters):
        ids = torch.randint(100, vocab, (1, input_len), generator=gen).to(device)
        _sync(device)
        t0 = time.perf_counter()
        out = hf.generate(ids, **kwargs)
        _sync(device)
        times.append(time.perf_counter() - t0)
        assert out.shape[1] - input_len == output_len
    mean = sum(times) / len(times)
    return {"batch_size": 1, "input_len": input_len, "output_len": output_len, "iters": iters,
            "request_ms": stats_ms(times), "tok_s": output_len / mean, "ms_per_token": 1000 * mean / output_len}


def _token_ids(requests: list[BenchRequest], tokenizer) -> list[list[int]]:
    return [r.prompt if isinstance(r.prompt, list) else tokenizer.encode(r.prompt, add_special_tokens=False)
            for r in requests]


def _cb_config(requests: list[BenchRequest], device: torch.device):
    """Let transformers size its cache from GPU memory; on CPU (where it cannot) size it for the
    whole dataset at once, with our engine's default token budget per step."""
    from transformers import ContinuousBatchingConfig

    if device.type == "cuda":
        return ContinuousBatchingConfig()
    block = 256
    blocks = sum(-(-(r.prompt_len + r.output_len + 1) // block) for r in requests) + 2
    return ContinuousBatchingConfig(block_size=block, num_blocks=blocks, max_batch_tokens=2048)


def hf_throughput(hf, requests: list[BenchRequest], tokenizer, attn: str = "paged|sdpa") -> dict:
    """The dataset through transformers continuous batching; every request gets its output_len."""
    from transformers import GenerationConfig

    inputs = _token_ids(requests, tokenizer)
    hf.set_attn_implementation(attn)
    cfg = GenerationConfig(max_new_tokens=max(r.output_len for r in requests), eos_token_id=-1, do_sample=False,
                           pad_token_id=0)
    device = next(hf.parameters()).device
    results = {}
    with hf.continuous_batching_context_manager(generation_config=cfg, block=True, timeout=5,
                                                continuous_batching_config=_cb_config(requests, device)) as manager:
        manager.add_request(inputs[0], request_id="warmup", max_new_tokens=2, eos_token_id=-1)
        while manager.get_result(timeout=1) is None:
            pass
        _sync(device)
        t0 = time.perf_counter()
        for i, (ids, r) in enumerate(zip(inputs, requests)):
            manager.add_request(ids, request_id=f"r{i}", max_new_tokens=r.output_len, eos_token_id=-1)
        while len(results) < len(requests):
            res = manager.get_result(timeout=1)
            if res is not None and res.is_finished():
                results[res.request_id] = res
            elif res is None and not manager.is_running():
                raise RuntimeError("transformers' continuous batching stopped before finishing the dataset")
        _sync(device)
        elapsed = time.perf_counter() - t0
    prompt_tokens = sum(len(x) for x in inputs)
    output_tokens = sum(len(res.generated_tokens) for res in results.values())
    return {"num_requests": len(requests), "elapsed_time": elapsed, "prompt_tokens": prompt_tokens,
            "completion_tokens": output_tokens, "rps": len(requests) / elapsed,
            "output_tok_s": output_tokens / elapsed, "total_tok_s": (prompt_tokens + output_tokens) / elapsed,
            "attn_implementation": attn}
