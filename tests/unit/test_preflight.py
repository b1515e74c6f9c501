"""The pre-flight memory check: an oversized model is refused with a message, a small one passes."""
import pytest

from tritongen import preflight
from tritongen.config import EngineConfig
from tritongen.models.loader import read_arch
from tritongen.preflight import GiB, InsufficientMemoryError, check_memory, estimate, num_params


def test_param_count_matches_the_published_sizes():
    assert num_params(read_arch("dummy:llama-2-7b")) == 6_738_415_616  # Llama-2-7B's 6.74B
    assert num_params(read_arch("dummy:llama-3-8b")) == 8_030_261_248
    assert num_params(read_arch("dummy:smollm2-135m")) == 134_515_008  # tied embedding counted once


def test_big_model_on_a_small_host_is_refused_with_what_fits():
    config = EngineConfig.from_kwargs(model="dummy:llama-2-7b", device="cpu")
    with pytest.raises(InsufficientMemoryError) as err:
        check_memory(config, "dummy:llama-2-7b", available=20 * GiB)  # a 24 GB machine
    msg = str(err.value)
    assert msg.startswith("dummy:llama-2-7b needs about 28.1 GiB (weights 25.1 GiB in float32, KV cache 1.0 GiB")
    assert "but 20.0 GiB of host memory (MemAvailable) is available" in msg
    assert "With --dtype bfloat16 (or float16) it needs about 15.3 GiB: fits." in msg
    for flag in ("--num-blocks", "--kv-cache-memory-gb", "--max-num-seqs", "smaller model"):
        assert flag in msg
    # What the message promised fits does.
    check_memory(EngineConfig.from_kwargs(model="dummy:llama-2-7b", device="cpu", dtype="bfloat16"),
                 "dummy:llama-2-7b", available=20 * GiB)


def test_an_oversized_kv_cache_gets_the_size_that_fits():
    config = EngineConfig.from_kwargs(model="dummy:tiny-llama", device="cpu", kv_cache_memory_gb=8)
    wanted = (r"weights 24 MiB in float32, KV cache 8\.0 GiB(.|\n)*"
              r"leave 1\.2 GiB for the KV cache: --kv-cache-memory-gb 1\.09 ")
    with pytest.raises(InsufficientMemoryError, match=wanted):
        check_memory(config, "dummy:tiny-llama", available=2 * GiB)
    check_memory(EngineConfig.from_kwargs(model="dummy:tiny-llama", device="cpu", kv_cache_memory_gb=1.1),
                 "dummy:tiny-llama", available=2 * GiB)


def test_tiny_model_passes_on_a_small_budget():
    check_memory(EngineConfig.from_kwargs(model="dummy:tiny-llama", device="cpu"), "dummy:tiny-llama",
                 available=2 * GiB)


def test_gpu_estimate_leaves_the_kv_cache_to_what_is_left_and_splits_over_ranks():
    config = EngineConfig.from_kwargs(model="dummy:llama-2-13b")
    arch = read_arch("dummy:llama-2-13b")
    one = estimate(arch, 2, config.cache, config.scheduler, on_gpu=True)
    two = estimate(arch, 2, config.cache, config.scheduler, on_gpu=True, tensor_parallel_size=2)
    assert one.kv_cache == 0 and one.min_kv_cache > 0 and one.runtime == 0
    assert two.weights == one.weights // 2
    msg = preflight.refusal(one, 20 * GiB, model="dummy:llama-2-13b", dtype="bfloat16", on_gpu=True)
    assert "free GPU memory within --gpu-memory-utilization" in msg and "--tensor-parallel-size" in msg
    assert preflight.refusal(two, 20 * GiB, model="m", dtype="bfloat16", on_gpu=True) is None


def test_mem_available_is_read_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20971520 kB\n")
    assert preflight.read_mem_available(meminfo) == 20 * GiB
    assert preflight.read_mem_available(tmp_path / "none") is None  # not Linux: no check


def test_engine_construction_runs_the_check(monkeypatch):
    """LLM, AsyncLLM, the OpenAI server and the Triton llm model all build their engine through
    create_engine: the refusal comes before any weight or KV block is allocated."""
    from tritongen import LLM

    monkeypatch.setattr(preflight, "read_mem_available", lambda: 1 * GiB)
    with pytest.raises(InsufficientMemoryError, match="refusing to load"):
        LLM("dummy:tiny-llama", device="cpu", kv_cache_memory_gb=3)


def test_gpu_budget_counts_the_allocators_cached_memory_as_ours(monkeypatch):
    """An engine closed earlier in the same process leaves its memory in torch's caching allocator:
    the driver reports it as used, but the next engine reuses it (without this, every engine after
    the first in a process was refused on the H200)."""
    import torch

    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * gib, 100 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 85 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 5 * gib)
    # free 10 + cached 80 - the 10 % kept back = 80 GiB.
    assert preflight.available_memory(torch.device("cuda", 0), 0.9) == 80 * gib
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 85 * gib)
    assert preflight.available_memory(torch.device("cuda", 0), 0.9) == 0  # a live engine's memory is not
