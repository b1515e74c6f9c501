"""Pre-flight memory check: refuse a model that cannot fit before a single weight is allocated.

A model that does not fit is otherwise found out by the kernel's OOM killer (a 7B model in float32
on a 24 GB CPU machine took the whole machine down, and Triton only said "Stub process is not
healthy"). So before loading, estimate weights + KV cache + activations and compare them with what
the device has: host RAM (/proc/meminfo MemAvailable) on CPU, free memory (torch.cuda.mem_get_info,
within --gpu-memory-utilization) on GPU. The estimate is a floor of what loading takes, not a
promise: a refusal means the load would certainly fail, and the message says what would fit.

Everything but `available_memory` and `check_memory` is pure arithmetic on a ModelArch.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tritongen.config import CacheConfig, EngineConfig, SchedulerConfig
from tritongen.models.arch import ModelArch

GiB = 1 << 30
CPU_RUNTIME_BYTES = GiB // 2
"""Python, torch and the tokenizer of one engine process on the host (measured ~0.4-0.6 GiB)."""


class InsufficientMemoryError(ValueError):
    """The model, its KV cache and activations do not fit; the message says what would."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one engine needs on the device it checks (all ranks' on CPU, one rank's on GPU)."""

    weights: int
    kv_cache: int
    """0 on GPU without num_blocks: the runner sizes the KV cache from what is left (>= 1 block)."""
    activations: int
    runtime: int
    """Per-process overhead outside the tensors (CPU only)."""
    min_kv_cache: int = 0
    """What must be left for the KV cache when it is sized from the rest: one block."""

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations + self.runtime + self.min_kv_cache


def num_params(arch: ModelArch) -> int:
    """All parameters of the model (the embedding counted once when lm_head shares it)."""
    h, d, i = arch.hidden_size, arch.head_dim, arch.intermediate_size
    q, kv = arch.num_attention_heads * d, arch.num_key_value_heads * d
    attn = 2 * h * q + 2 * h * kv + (q + 2 * kv) * arch.attention_bias + h * arch.o_proj_bias + 2 * d * arch.qk_norm
    mats = 3 if arch.mlp == "gated" else 2  # gated (Llama) or plain (GPT-2, Bloom) MLP
    mlp = mats * h * i + ((mats - 1) * i + h) * arch.mlp_bias
    norm = h * (2 if arch.norm_bias else 1)  # LayerNorms carry a bias
    embed = arch.vocab_size * h
    positions = arch.max_position_embeddings * h if arch.position_encoding == "learned" else 0  # GPT-2
    # MoE layers (Mixtral, Qwen3-MoE): every expert's gated MLP and the router instead of `mlp`.
    moe = sum(arch.is_moe_layer(i) for i in range(arch.num_hidden_layers))
    experts = moe * arch.num_experts * (3 * h * arch.moe_intermediate_size + h)
    return (arch.num_hidden_layers * (attn + 2 * norm) + (arch.num_hidden_layers - moe) * mlp + experts + norm
            + embed + positions + (0 if arch.tie_word_embeddings else embed))


def kv_bytes_per_block(arch: ModelArch, block_size: int, dtype_bytes: int) -> int:
    """K and V of one block over all layers and all KV heads."""
    return 2 * arch.num_hidden_layers * block_size * arch.num_key_value_heads * arch.head_dim * dtype_bytes


def activation_bytes(arch: ModelArch, dtype_bytes: int, sched: SchedulerConfig, max_len: int, on_gpu: bool) -> int:
    """One step at the full token budget: the runner's GPU reserve (hidden states and MLP of every
    scheduled token, float32 logits of every sequence), plus on CPU the reference attention's float32
    scores and probabilities of one chunk over a context as long as itself."""
    tokens = sched.max_num_batched_tokens
    act = tokens * (4 * arch.hidden_size + 3 * arch.intermediate_size) * dtype_bytes
    act += sched.max_num_seqs * arch.vocab_size * 4 * 3
    if not on_gpu:
        act += 2 * arch.num_attention_heads * tokens * min(tokens, max_len) * 4
    return act


def kv_dtype_bytes(cache: CacheConfig, dtype_bytes: int) -> int:
    """Bytes of one KV-cache element: 1 in fp8, else the model dtype's."""
    return 1 if cache.fp8_kv_cache else dtype_bytes


def estimate(arch: ModelArch, dtype_bytes: int, cache: CacheConfig, sched: SchedulerConfig, *,
             on_gpu: bool, tensor_parallel_size: int = 1, max_model_len: Optional[int] = None) -> MemoryEstimate:
    """What loading `arch` takes. On CPU every rank shares the host, so the whole model counts; on
    GPU one rank's share is checked against its own device."""
    per_block = kv_bytes_per_block(arch, cache.block_size, kv_dtype_bytes(cache, dtype_bytes))
    weights = num_params(arch) * dtype_bytes
    min_kv = 0
    if cache.num_blocks:
        kv = cache.num_blocks * per_block
    elif on_gpu:
        kv, min_kv = 0, per_block
    else:
        kv = max(1, int(cache.kv_cache_memory_gb * GiB) // per_block) * per_block
    max_len = max_model_len or arch.max_position_embeddings
    act = activation_bytes(arch, dtype_bytes, sched, max_len, on_gpu)
    if on_gpu:
        tp = tensor_parallel_size
        return MemoryEstimate(weights // tp, kv // tp, act, 0, min_kv // tp)
    return MemoryEstimate(weights, kv, act, CPU_RUNTIME_BYTES * tensor_parallel_size)


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if abs(n) >= GiB // 10 else f"{n / (1 << 20):.0f} MiB"


def refusal(est: MemoryEstimate, available: int, *, model: str, dtype: str, on_gpu: bool,
            smaller: Optional[MemoryEstimate] = None) -> Optional[str]:
    """None when `est` fits in `available` bytes, else the message: what is needed, what there is,
    what would fit (`smaller`: the same model in a 2-byte dtype) and the flags that help."""
    if est.total <= available:
        return None
    where = "free GPU memory within --gpu-memory-utilization" if on_gpu else "host memory (MemAvailable)"
    kv = f"KV cache {_gib(est.kv_cache)}" if est.kv_cache or not on_gpu else "KV cache: what is left (>= 1 block)"
    lines = [f"{model} needs about {_gib(est.total)} (weights {_gib(est.weights)} in {dtype}, {kv}, "
             f"activations {_gib(est.activations)}"
             + (f", runtime {_gib(est.runtime)}" if est.runtime else "") + f") but {_gib(available)} of {where} "
             "is available; refusing to load it rather than run out of memory."]
    if smaller is not None and est.weights >= est.kv_cache:
        fits = "fits" if smaller.total <= available else "still does not fit"
        lines.append(f"With --dtype bfloat16 (or float16) it needs about {_gib(smaller.total)}: {fits}.")
    room = available - (est.total - est.kv_cache)
    if est.kv_cache and room > 0:
        lines.append(f"The weights and activations leave {_gib(room)} for the KV cache: "
                     f"--kv-cache-memory-gb {max(room / GiB * 0.9, 0.01):.2f} (or a smaller --num-blocks) fits.")
    lines.append("Flags that help: --dtype (2 bytes per weight instead of 4), --num-blocks / --kv-cache-memory-gb "
                 "/ --kv-cache-dtype fp8 (KV cache), --max-num-batched-tokens / --max-num-seqs (activations), "
                 "--max-model-len"
                 + (", --gpu-memory-utilization, --tensor-parallel-size" if on_gpu else "")
                 + "; or a smaller model (`tritongen presets` lists the dummy ones with their sizes).")
    return "\n".join(lines)


def read_mem_available(meminfo: Path = Path("/proc/meminfo")) -> Optional[int]:
    """MemAvailable in bytes, or None where the kernel does not say (not Linux)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_memory(device, gpu_memory_utilization: float) -> Optional[int]:
    """Bytes the engine may still take on `device` (a torch.device), None when unknown."""
    if device.type != "cuda":
        return read_mem_available()
    import torch

    free, total = torch.cuda.mem_get_info(device)
    # The runner's budget before any tensor of ours exists: total * utilization - (used by others).
    # Memory this process's caching allocator holds but no tensor uses (an engine closed earlier in
    # the same process) is ours to reuse: the driver counts it as taken.
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free + cached - total * (1 - gpu_memory_utilization))


def check_memory(config: EngineConfig, model_path: str, available: Optional[int] = None) -> None:
    """Raise InsufficientMemoryError when the model of `config` cannot fit; `available` overrides
    the device's own figure (tests). Called by create_engine before the model is built."""
    from tritongen.models.loader import read_arch
    from tritongen.runner.model_runner import resolve_device, resolve_dtype

    arch = read_arch(model_path)
    device = resolve_device(config.model.device)
    dtype = resolve_dtype(config.model.dtype, device, arch.torch_dtype)
    dtype_bytes = dtype.itemsize
    if available is None:
        available = available_memory(device, config.cache.gpu_memory_utilization)
        if available is None:
            return
    on_gpu = device.type == "cuda"
    kwargs = dict(on_gpu=on_gpu, tensor_parallel_size=config.parallel.tensor_parallel_size,
                  max_model_len=config.model.max_model_len)
    est = estimate(arch, dtype_bytes, config.cache, config.scheduler, **kwargs)
    smaller = estimate(arch, 2, config.cache, config.scheduler, **kwargs) if dtype_bytes > 2 else None
    message = refusal(est, available, model=config.model.model or model_path, dtype=str(dtype).replace("torch.", ""),
                      on_gpu=on_gpu, smaller=smaller)
    if message:
        raise InsufficientMemoryError(message)

