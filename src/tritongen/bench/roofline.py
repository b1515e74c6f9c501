"""Roofline floors: the least time a decode step, or a whole dataset, can take on given hardware.

Model (DESIGN.md, "Performance method"):
  decode step  max((weight bytes + KV bytes read) / bandwidth, FLOPs / peak FLOP/s)
  prefill      FLOPs / peak FLOP/s (compute-bound)
Weight bytes are every matrix a step multiplies by (all layers and lm_head, tied or not) plus the
norms; the embedding table is not read whole (a step gathers only its rows). FLOPs are 2 per
multiply-add of those matrices per token plus attention (4 * context * heads * head_dim per token
and layer; half of that on average inside a causal prefill). Defaults are the ceilings measured on
one NVIDIA H200: 4.26 TB/s (copy) and 795 TFLOP/s (bf16 GEMM).
Pure Python: works from a ModelArch without loading weights.
"""
from __future__ import annotations

from dataclasses import dataclass

from tritongen.models.arch import ModelArch

H200_BANDWIDTH = 4.26e12
H200_FLOPS = 795e12
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
               "fp8": 1, "int8": 1}


@dataclass(frozen=True)
class Hardware:
    bandwidth: float = H200_BANDWIDTH
    """Bytes per second the device streams from memory."""
    flops: float = H200_FLOPS
    """Peak FLOP/s in the model's dtype."""


def dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def matmul_params(arch: ModelArch) -> int:
    """Parameters multiplied per token: every layer's linears and norms, the final norm and lm_head.
    The MLP has three matrices when gated (Llama), two when plain (GPT-2, Bloom); LayerNorms carry
    a bias; qk-norm adds two head_dim weights per layer."""
    h, d, i = arch.hidden_size, arch.head_dim, arch.intermediate_size
    q, kv = arch.num_attention_heads * d, arch.num_key_value_heads * d
    attn = h * q + 2 * h * kv + q * h
    attn += (q + 2 * kv) * arch.attention_bias + h * arch.o_proj_bias + 2 * d * arch.qk_norm
    mats = 3 if arch.mlp == "gated" else 2
    mlp = mats * h * i + ((mats - 1) * i + h) * arch.mlp_bias
    norm = h * (2 if arch.norm_bias else 1)
    # MoE layers: the router and the top-k experts a token is routed to (benchmarks/moe_suite.py
    # counts the distinct experts a whole batch reads).
    moe = sum(arch.is_moe_layer(i) for i in range(arch.num_hidden_layers))
    routed = moe * arch.num_experts_per_tok * 3 * h * arch.moe_intermediate_size + moe * arch.num_experts * h
    return arch.num_hidden_layers * (attn + 2 * norm) + (arch.num_hidden_layers - moe) * mlp + routed + norm \
        + arch.vocab_size * h


def total_params(arch: ModelArch) -> int:
    """All parameters (the embedding counted once when lm_head shares it; GPT-2's position table)."""
    embed = arch.vocab_size * arch.hidden_size
    positions = arch.max_position_embeddings * arch.hidden_size if arch.position_encoding == "learned" else 0
    moe = sum(arch.is_moe_layer(i) for i in range(arch.num_hidden_layers))
    unrouted = moe * (arch.num_experts - arch.num_experts_per_tok) * 3 * arch.hidden_size * arch.moe_intermediate_size
    return matmul_params(arch) + unrouted + (0 if arch.tie_word_embeddings else embed) + positions


def kv_bytes_per_token(arch: ModelArch, dtype: str) -> int:
    return 2 * arch.num_hidden_layers * arch.num_key_value_heads * arch.head_dim * dtype_bytes(dtype)


QUANTIZATIONS = (None, "fp8")


def weight_bytes(arch: ModelArch, dtype: str, quantization: str | None = None) -> int:
    """Bytes of the parameters a token multiplies (matmul_params): all in `dtype`, or with
    quantization "fp8" the linear layers at one byte each while lm_head stays in `dtype` (what
    `--quantization fp8` loads; the norms' few weights are counted at one byte too)."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; choose from {QUANTIZATIONS}")
    if quantization is None:
        return matmul_params(arch) * dtype_bytes(dtype)
    head = arch.vocab_size * arch.hidden_size
    return (matmul_params(arch) - head) + head * dtype_bytes(dtype)


def _matmul_rate(hw: Hardware, quantization: str | None) -> float:
    """FLOP/s of the linear layers: hw.flops (the model's dtype), twice it on FP8 tensor cores."""
    return hw.flops * (2 if quantization == "fp8" else 1)


def _attn_flops_per_token(arch: ModelArch, context: float) -> float:
    return 4.0 * context * arch.num_attention_heads * arch.head_dim * arch.num_hidden_layers


def decode_step_floor(arch: ModelArch, dtype: str, context_lens: list[int], hw: Hardware = Hardware(),
                      quantization: str | None = None, kv_dtype: str | None = None) -> dict:
    """Floor of one decode step of len(context_lens) sequences (each context includes the new token);
    `quantization` and `kv_dtype` (default `dtype`) as the engine's --quantization / --kv-cache-dtype."""
    weights = weight_bytes(arch, dtype, quantization)
    kv = sum(context_lens) * kv_bytes_per_token(arch, kv_dtype or dtype)
    mm_flops = 2.0 * matmul_params(arch) * len(context_lens)
    attn_flops = sum(_attn_flops_per_token(arch, c) for c in context_lens)
    flops = mm_flops + attn_flops
    t_mem, t_compute = (weights + kv) / hw.bandwidth, mm_flops / _matmul_rate(hw, quantization) + attn_flops / hw.flops
    return {"batch_size": len(context_lens), "weight_bytes": weights, "kv_bytes": kv, "flops": flops,
            "memory_s": t_mem, "compute_s": t_compute, "floor_s": max(t_mem, t_compute),
            "bound": "memory" if t_mem >= t_compute else "compute"}


def dataset_floor(arch: ModelArch, dtype: str, pairs: list[tuple[int, int]], max_batch: int,
                  hw: Hardware = Hardware(), quantization: str | None = None, kv_dtype: str | None = None) -> dict:
    """Floor of serving every (prompt_len, output_len) pair with at most max_batch sequences per step.

    Prefill is compute-bound. Decode (output tokens after the first, which prefill yields) needs at
    least max(ceil(decode tokens / max_batch), longest output - 1) steps, each reading all weights,
    plus every token's KV context once per generated token.
    """
    p_mm = matmul_params(arch)
    mm_rate = _matmul_rate(hw, quantization)
    prompt_tokens = sum(p for p, _ in pairs)
    prefill_s = sum(2.0 * p_mm * p / mm_rate + _attn_flops_per_token(arch, p / 2) * p / hw.flops for p, _ in pairs)
    decode_tokens = sum(max(o - 1, 0) for _, o in pairs)
    steps = max(-(-decode_tokens // max_batch), max((o - 1 for _, o in pairs), default=0))
    # Context read when generating token t (1-based after the first) of a request: p + t.
    context_sum = sum((o - 1) * p + (o - 1) * o / 2 for p, o in pairs if o > 1)
    decode_bytes = steps * weight_bytes(arch, dtype, quantization) \
        + context_sum * kv_bytes_per_token(arch, kv_dtype or dtype)
    decode_s = max(decode_bytes / hw.bandwidth,
                   2.0 * p_mm * decode_tokens / mm_rate + _attn_flops_per_token(arch, context_sum) / hw.flops)
    output_tokens = sum(o for _, o in pairs)
    floor = prefill_s + decode_s
    return {"num_requests": len(pairs), "max_batch": max_batch, "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens, "decode_steps": steps, "prefill_s": prefill_s,
            "decode_s": decode_s, "floor_s": floor, "output_tok_s_ceiling": output_tokens / floor if floor else None}


def achieved(floor_s: float, measured_s: float) -> float:
    """Fraction of the roofline reached: floor / measured (1.0 = at the floor)."""
    return floor_s / measured_s if measured_s > 0 else float("nan")


def format_step(arch_name: str, dtype: str, r: dict, measured_ms: float | None = None) -> str:
    lines = [
        f"model {arch_name}  dtype {dtype}  batch {r['batch_size']}",
        f"  weights read   {r['weight_bytes'] / 1e9:.3f} GB   KV read {r['kv_bytes'] / 1e9:.4f} GB   "
        f"FLOPs {r['flops'] / 1e9:.1f} G",
        f"  decode step floor  {r['floor_s'] * 1e3:.3f} ms ({r['bound']}-bound)  "
        f"=> {r['batch_size'] / r['floor_s']:.0f} tok/s ceiling",
    ]
    if measured_ms:
        lines.append(f"  measured {measured_ms:.3f} ms  achieved fraction {achieved(r['floor_s'], measured_ms / 1e3):.3f}")
    return "\n".join(lines)


def format_dataset(r: dict, measured_s: float | None = None) -> str:
    lines = [
        f"dataset: {r['num_requests']} requests, {r['prompt_tokens']} prompt / {r['output_tokens']} output tokens, "
        f"batch <= {r['max_batch']}",
        f"  prefill floor {r['prefill_s']:.3f} s   decode floor {r['decode_s']:.3f} s ({r['decode_steps']} steps)",
        f"  dataset floor {r['floor_s']:.3f} s  => {r['output_tok_s_ceiling']:.0f} output tok/s ceiling",
    ]
    if measured_s:
        lines.append(f"  measured {measured_s:.3f} s  achieved fraction {achieved(r['floor_s'], measured_s):.3f}")
    return "\n".join(lines)
