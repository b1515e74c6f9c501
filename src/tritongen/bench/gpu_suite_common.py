"""Shared parts of benchmarks/gpu_suite.py: its settings, result rows, the one engine it holds at a
time, device ceilings (copy bandwidth, GEMM rate) and the HF peer built from our exact weights.

One engine at a time: an engine takes ~90% of the GPU for its KV cache, so a second engine or an
HF model only fits after the first is gone (del + gc + empty_cache), which SuiteContext enforces.
"""
from __future__ import annotations

import gc
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from tritongen.bench.roofline import Hardware

MODEL_7B = "dummy:llama-2-7b"
MODEL_13B = "dummy:llama-2-13b"


@dataclass(frozen=True)
class SuiteConfig:
    device: str = "cuda"
    """Where everything runs (cpu only in --smoke)."""
    dtype: str = "bfloat16"
    """Weights and KV cache dtype, ours and the peer's."""
    bs1_models: tuple[str, ...] = (MODEL_7B, MODEL_13B)
    steps_models: tuple[str, ...] = (MODEL_7B,)
    profile_model: str = MODEL_7B
    offline_models: tuple[str, ...] = (MODEL_7B,)
    serving_models: tuple[str, ...] = (MODEL_7B,)
    logits_models: tuple[str, ...] = ("dummy:tiny-llama", "dummy:tiny-qwen2")
    """Tiny configs of the bf16-vs-fp32 logits check."""
    bs1_input_len: int = 128
    bs1_output_len: int = 256
    iters: int = 2
    """Timed repetitions of latency measurements (after one warm-up)."""
    step_batches: tuple[int, ...] = (8, 32, 128)
    step_context: int = 512
    """Mean context of the timed decode steps."""
    step_decode_tokens: int = 64
    """Decode steps timed per run (the prompt is step_context - half of these)."""
    profile_steps: int = 20
    dataset: str = "sharegpt-like"
    num_prompts: int = 1000
    peer_subset: int = 64
    """Requests of the offline dataset that the HF peer runs (and ours again, for a fair ratio)."""
    peer: bool = True
    """Run the HF peers."""
    seed: int = 0
    copy_bytes: int = 4 << 30
    gemm_n: int = 8192
    gemm_dtype: str = "bfloat16"
    pytest_k: str = "not default_model"
    """pytest -k filter for tests/gpu (the default model's weights are not on the device)."""
    serving_concurrency: int = 128
    serving_num_prompts: int = 1000
    serving_args: str = ""
    """Extra arguments for benchmarks/gpu_serving.py."""
    serving_timeout: float = 480.0
    """Seconds per gpu_serving.py call (a device command may run 600 s in all)."""
    clip_prompt: Optional[int] = None
    """Smoke only: cut offline prompts to this many tokens."""
    clip_output: Optional[int] = None
    """Smoke only: cut offline outputs to this many tokens."""
    kv_cache_memory_gb: Optional[float] = None
    """Smoke only: small CPU KV cache (the engine's default is 1 GB)."""


@dataclass
class Row:
    """One line of the final table (and of the JSON's "rows")."""

    section: str
    name: str
    ours: Optional[float] = None
    peer: Optional[float] = None
    """The peer's number from the same run (HF transformers, or the OpenAI server for Triton)."""
    ratio: Optional[float] = None
    """ours / peer."""
    fraction: Optional[float] = None
    """Roofline fraction: floor time / measured time (1.0 = at the floor)."""
    unit: str = ""
    goal: str = ""
    met: Optional[bool] = None
    note: str = ""


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def short(model: str) -> str:
    return model.split(":", 1)[-1].rstrip("/").rsplit("/", 1)[-1]


def free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class SuiteContext:
    cfg: SuiteConfig
    root: str
    """Repository root (subprocesses run there)."""
    out_dir: str
    """Where side files (pytest log, serving JSON) go."""
    hw: Hardware = field(default_factory=Hardware)
    hw_source: str = "DESIGN.md constants (roofline section not run)"
    t0: float = field(default_factory=time.perf_counter)
    _engine: Optional[tuple[str, Any]] = None

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - self.t0:6.1f}s] {msg}", flush=True)

    def engine(self, model: str):
        """Our engine for `model` (bf16, no prefix caching: benchmark prompts share nothing by
        construction, and the peer subset must not hit blocks the full run left behind)."""
        if self._engine is not None and self._engine[0] == model:
            return self._engine[1]
        self.release()
        from tritongen import LLM

        kw = {} if self.cfg.kv_cache_memory_gb is None else {"kv_cache_memory_gb": self.cfg.kv_cache_memory_gb}
        self.log(f"loading our engine {model} ({self.cfg.dtype}, {self.cfg.device})")
        llm = LLM(model, device=self.cfg.device, dtype=self.cfg.dtype, seed=self.cfg.seed,
                  enable_prefix_caching=False, **kw)
        self._engine = (model, llm)
        self.log(f"engine ready: {llm.engine.runner.num_blocks} KV blocks, {gpu_mem_gb():.1f} GB allocated")
        return llm

    def release(self) -> None:
        """Drop our engine and collect garbage (also what a failed section left behind)."""
        if self._engine is not None:
            llm, self._engine = self._engine[1], None
            if hasattr(llm, "shutdown"):  # newer LLMs own worker processes
                llm.shutdown()
            del llm  # the last reference (a bound method kept in a local held the whole engine)
        free_memory()

    def take_weights(self, model: str) -> tuple[dict, Any]:
        """(HF-named state dict, arch) of our engine's weights; the engine itself (KV cache, graphs) is freed.
        The state dict's tensors keep only the weights alive."""
        llm = self.engine(model)
        state, arch = llm.engine.runner.model.hf_state_dict(), llm.engine.runner.arch
        del llm
        self._engine = None
        free_memory()
        return state, arch

    def hf_peer(self, model: str):
        """HF transformers model holding exactly our engine's weights for `model`."""
        import torch

        state, arch = self.take_weights(model)
        dtype = getattr(torch, self.cfg.dtype)
        self.log(f"building the HF twin of {model} on {self.cfg.device}")
        hf = hf_from_state(state, arch, dtype, torch.device(self.cfg.device))
        del state
        free_memory()
        self.log(f"HF twin ready, {gpu_mem_gb():.1f} GB allocated (its weights only, else our engine leaked)")
        return hf


def gpu_mem_gb() -> float:
    import torch

    return torch.cuda.memory_allocated() / 1e9 if torch.cuda.is_available() else 0.0


def hf_from_state(state: dict, arch, dtype, device, attn_implementation: str = "sdpa"):
    """Like models.hf_twin.hf_twin, but allocated on `device` directly: a 13B twin built on the CPU
    takes minutes to initialise and 26 GB of host memory. Classes without SDPA attention (Bloom)
    get their eager one."""
    import torch
    import transformers

    d = arch.to_hf_config()
    config = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    cls = transformers.AutoModelForCausalLM._model_mapping[type(config)]
    if attn_implementation == "sdpa" and not getattr(cls, "_supports_sdpa", True):
        attn_implementation = "eager"
    with torch.device(device):
        hf = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                           attn_implementation=attn_implementation)
    hf.load_state_dict(state, strict=True)
    return hf.eval()


# -- device ceilings --------------------------------------------------------------------------------

def sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_call(fn: Callable[[], Any], device, iters: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / iters


def copy_bandwidth(device, nbytes: int, iters: int = 10) -> float:
    """Bytes/s of a device-to-device copy, counting read + write (as DESIGN.md's 4.26 TB/s)."""
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = seconds_per_call(lambda: dst.copy_(src), device, iters)
    return 2 * nbytes / t


def gemm_flops(device, n: int, dtype_name: str, iters: int = 20) -> float:
    """FLOP/s of an n x n x n matmul in dtype."""
    import torch

    dtype = getattr(torch, dtype_name)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    t = seconds_per_call(lambda: torch.matmul(a, b, out=out), device, iters)
    return 2.0 * n ** 3 / t


def env_info(device: str) -> dict:
    import platform

    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "argv": sys.argv, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    for pkg in ("transformers", "triton", "numpy"):
        try:
            info[pkg] = __import__(pkg).__version__
        except Exception:  # noqa: BLE001 - a missing package is recorded, not fatal
            info[pkg] = None
    if device.startswith("cuda") and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info["gpu"] = {"name": p.name, "memory_gb": p.total_memory / 1e9, "count": torch.cuda.device_count()}
    return info


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def format_table(rows: list[Row]) -> str:
    """The GPU suites' result table (gpu_suite, family_suite): one line per row, goals last."""
    head = (f"{'measurement':<48} {'unit':<7} {'ours':>9} {'peer':>9} {'ours/peer':>9} {'roofline':>8}  "
            f"{'goal':<28} met")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.name[:48]:<48} {r.unit[:7]:<7} {_fmt(r.ours):>9} {_fmt(r.peer):>9} {_fmt(r.ratio):>9} "
                     f"{_fmt(r.fraction):>8}  {r.goal[:28]:<28} {_fmt(r.met):<3}" + (f"  {r.note}" if r.note else ""))
    return "\n".join(lines)
