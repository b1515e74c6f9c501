"""Small frozen configs, one per subsystem. Field docstrings double as CLI help. Pure Python."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
"""Values of CacheConfig.kv_cache_dtype (vLLM's names; fp8 is e4m3)."""


@dataclass(frozen=True)
class ModelConfig:
    model: Optional[str] = None
    """HF directory, `dummy:<preset>`, or None for the default model (SmolLM2-135M-Instruct)."""
    tokenizer: Optional[str] = None
    """Tokenizer directory; defaults to the model's (the default model's for dummy presets)."""
    dtype: str = "auto"
    """float32 | bfloat16 | float16 | auto (checkpoint dtype on GPU, float32 on CPU)."""
    device: str = "auto"
    """cpu | cuda | cuda:N | auto (cuda when available)."""
    max_model_len: Optional[int] = None
    """Longest prompt + output in tokens; defaults to the model's max_position_embeddings."""
    seed: int = 0
    """Seed for dummy weights and for unseeded sampling."""
    enforce_eager: bool = False
    """Disable CUDA graphs for decode steps (always run eager PyTorch)."""
    mixed_cuda_graphs: bool = True
    """CUDA, Triton attention, one GPU, dense models: also capture steps that carry prompt tokens
    (padded to token buckets up to 2048) instead of launching them eagerly; elsewhere it is ignored.
    --no-mixed-cuda-graphs saves their capture time and memory at load."""
    attention_backend: str = "auto"
    """reference | triton | auto (Triton kernels on CUDA when the triton package is installed)."""
    fused_silu_mul: bool = True
    """Triton backend: let the MLP's stacked gate/up GEMM apply SiLU·mul in its epilogue for decode
    batches where that measures faster at load than the GEMM and the SiLU·mul kernel."""
    quantization: Optional[str] = None
    """fp8: quantize the linear layers (not lm_head) of a bf16/fp16 checkpoint to FP8 e4m3 at load,
    per output channel. Unset: the checkpoint's own dtype, or its quantization_config for FP8
    checkpoints (HF "fp8", compressed-tensors float-quantized), which load as published."""
    quantize_lm_head: bool = False
    """With quantization fp8: quantize lm_head too, per output channel (a tied embedding keeps its
    table in the model dtype; lm_head gets its own FP8 copy). Off: lm_head stays in the model dtype,
    as vLLM keeps it. Not with tensor parallelism, nor on FP8 checkpoints (their quantization_config
    names the layers left unquantized)."""


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    """Tokens per KV-cache block."""
    num_blocks: Optional[int] = None
    """KV-cache blocks to allocate; default from kv_cache_memory_gb (CPU) or free GPU memory."""
    kv_cache_memory_gb: float = 1.0
    """KV-cache size on CPU when num_blocks is not given."""
    gpu_memory_utilization: float = 0.90
    """Fraction of GPU memory the engine may use (weights + activations + KV cache)."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of identical prompt prefixes."""
    kv_cache_dtype: str = "auto"
    """auto | fp8 (alias fp8_e4m3): the KV cache's element type. auto: the model dtype; fp8: float8
    e4m3, one byte per element (twice the tokens of a bf16 cache in the same memory), stored as
    x / scale with per-layer k/v scales from the checkpoint (`self_attn.k_scale` / `v_scale`,
    `k_proj` / `v_proj.output_scale`), 1.0 where it has none."""

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            hint = " (only the e4m3 FP8 format is supported)" if "e5m2" in str(self.kv_cache_dtype) else ""
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                             f"got {self.kv_cache_dtype!r}{hint}")

    @property
    def fp8_kv_cache(self) -> bool:
        return self.kv_cache_dtype in ("fp8", "fp8_e4m3")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    """Most requests running in one step."""
    max_num_batched_tokens: int = 2048
    """Token budget of one step; longer prompts are prefilled in chunks."""
    async_scheduling: bool = True
    """On CUDA, launch the next decode step before the current one finishes, fed with its sampled
    ids on the device, so the GPU never waits for the host (outputs are unchanged)."""


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1
    """GPUs (or, on CPU, gloo processes) one model is split over; ranks 1.. run in worker processes."""
    disable_custom_all_reduce: bool = False
    """Tensor parallelism on CUDA: NCCL for every all-reduce instead of the symmetric-memory kernels
    (vLLM's flag of the same name)."""
    fused_all_reduce_rows: Optional[int] = None
    """Tensor parallelism with the Triton kernels: batches up to this many rows reduce inside the next
    RMSNorm's kernel (all-reduce + residual add + RMSNorm in one launch); 0: torch's two-shot kernel
    and a separate add + RMSNorm. Unset: 512."""
    lamport_all_reduce: Optional[bool] = None
    """The fused all-reduce's protocol for small batches: on = the Lamport kernel (one NVLink trip;
    up to 128 rows), off = the flag handshake. Unset: both are timed at load and the faster serves."""
    tp_timeout_s: float = 600.0
    """How long a rank waits for the others (start-up, every collective, the fused all-reduce
    kernels) before it fails instead of hanging."""
    log_level: Optional[str] = None
    """Log level of the engine's child processes (engine process, tensor-parallel workers), e.g.
    INFO or DEBUG. Unset: the engine process takes its parent's level, the workers INFO."""
    engine_process: Optional[bool] = None
    """Servers (AsyncLLM): run the engine loop in a child process, so that the frontend's per-token
    work (Triton responses, SSE chunks) does not share a GIL with the engine's host work. Unset:
    on when the engine runs on CUDA (Triton gRPC streaming 0.60 -> 1.01x the OpenAI server's RPS
    on the H200), off on CPU (no child process to start)."""


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self) -> None:
        if self.model.quantize_lm_head and self.parallel.tensor_parallel_size > 1:
            raise ValueError("quantize_lm_head is not supported with tensor_parallel_size > 1 "
                             "(lm_head is split over the vocabulary)")

    @classmethod
    def from_kwargs(cls, **kwargs) -> "EngineConfig":
        """Split flat keyword arguments (as LLM(...) takes them) into the sub-configs."""
        parts = {}
        for name, sub in ENGINE_CONFIG_PARTS:
            names = {f.name for f in fields(sub)}
            parts[name] = sub(**{k: kwargs.pop(k) for k in list(kwargs) if k in names})
        if kwargs:
            raise TypeError(f"unknown engine options: {sorted(kwargs)}")
        return cls(**parts)


DEFAULT_MAX_QUEUE = 4096
"""Both frontends' default admission bound: requests that may wait beyond max_num_seqs running
(`--max-queue`, the `llm` model parameter `max_queue`; 0 = no bound)."""

ENGINE_CONFIG_PARTS: tuple[tuple[str, type], ...] = (
    ("model", ModelConfig), ("cache", CacheConfig), ("scheduler", SchedulerConfig), ("parallel", ParallelConfig))
"""EngineConfig's parts by field name; every field of every part is a flat engine option (CLI flag,
LLM keyword, Triton model parameter)."""
