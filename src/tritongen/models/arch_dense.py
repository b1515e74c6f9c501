"""config.json parsers and writers of Baichuan / Baichuan2, Gemma 2, Gemma 3 text and Phi-3.

Pure Python like models/arch.py, whose helpers these use; importing this module registers these
families with ModelArch (the package tritongen.models imports it). Each writer emits the layout its model's own loader reads: HF's
transformers 5.x layout for Gemma and Phi-3, and for Baichuan (remote code only, no transformers
class) the keys its Hub config.json files carry.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Optional

from tritongen.models.arch import (
    ModelArch,
    _check_supported_options,
    _eos_ids,
    _parse_llama_family,
    _parse_rope,
    _require,
    _write_llama_family,
    register_families,
)

# -- Baichuan / Baichuan2 ---------------------------------------------------------------------------

BAICHUAN2_VOCAB = 125696
"""Baichuan2's vocabulary (Baichuan 1: 64000); with Baichuan2's z_loss_weight key, its marker."""
_BAICHUAN_ROPE_THETA = 10000.0  # Baichuan's RotaryEmbedding base; its configs do not state it
_BAICHUAN_DEFAULT_MAX_LEN = 4096


def _parse_baichuan(architecture: str, d: dict) -> ModelArch:
    """One HF class name covers two layouts. The 7B configs define max_position_embeddings (RoPE);
    the 13B ones only model_max_length (ALiBi has no position table). On every released
    checkpoint this agrees with vLLM's rule (hidden_size 4096 = RoPE). Baichuan2 normalizes
    lm_head (NormHead): its vocabulary, or its config class's z_loss_weight key, tells it apart."""
    _check_supported_options(d)
    if d.get("num_key_value_heads") not in (None, d.get("num_attention_heads")):
        raise ValueError("unsupported Baichuan option num_key_value_heads: Baichuan's W_pack is multi-head")
    hidden, heads = int(_require(d, "hidden_size")), int(_require(d, "num_attention_heads"))
    rope = d.get("max_position_embeddings") is not None
    vocab = int(_require(d, "vocab_size"))
    return ModelArch(
        architecture=architecture, vocab_size=vocab, hidden_size=hidden,
        intermediate_size=int(_require(d, "intermediate_size")),
        num_hidden_layers=int(_require(d, "num_hidden_layers")), num_attention_heads=heads,
        num_key_value_heads=heads, head_dim=hidden // heads, norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=_BAICHUAN_ROPE_THETA if rope else None, rope_scaling=None,
        max_position_embeddings=int(d.get("max_position_embeddings") or d.get("model_max_length")
                                    or _BAICHUAN_DEFAULT_MAX_LEN),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)), attention_bias=False,
        bos_token_id=d.get("bos_token_id"), eos_token_ids=_eos_ids(d.get("eos_token_id")),
        torch_dtype=d.get("torch_dtype") or d.get("dtype"),
        position_encoding="rope" if rope else "alibi",
        normalized_lm_head=vocab == BAICHUAN2_VOCAB or "z_loss_weight" in d,
    )


def _write_baichuan(a: ModelArch) -> dict:
    d: dict[str, Any] = {"hidden_size": a.hidden_size, "intermediate_size": a.intermediate_size,
                         "num_hidden_layers": a.num_hidden_layers, "num_attention_heads": a.num_attention_heads,
                         "hidden_act": "silu", "rms_norm_eps": a.norm_eps,
                         "model_max_length": a.max_position_embeddings}
    if a.position_encoding == "rope":
        d["max_position_embeddings"] = a.max_position_embeddings
    if a.normalized_lm_head:
        d["z_loss_weight"] = 0
    return d


# -- Gemma 2, Gemma 3 text --------------------------------------------------------------------------

_GEMMA_ACTS = ("gelu_pytorch_tanh", "gelu_new", "gelu")
_GEMMA3_WINDOW_PATTERN = 6  # Gemma3TextConfig's sliding_window_pattern default
_GEMMA3_THETA, _GEMMA3_LOCAL_THETA = 1_000_000.0, 10_000.0


def _default(d: dict, key: str, default: Any) -> Any:
    """d[key] when the key is present (null included: Gemma 3 says final_logit_softcapping: null),
    else the config class's default."""
    return d[key] if key in d else default


def _parse_gemma(architecture: str, d: dict) -> ModelArch:
    gemma3 = architecture == "Gemma3ForCausalLM"
    act = d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in _GEMMA_ACTS:
        raise ValueError(f"unsupported Gemma hidden_activation {act!r}; supported: {', '.join(_GEMMA_ACTS)}")
    if d.get("use_bidirectional_attention"):
        raise ValueError("unsupported Gemma option use_bidirectional_attention: decoder-only (causal) models only")
    layers = int(_require(d, "num_hidden_layers"))
    layer_types = d.get("layer_types")
    if layer_types is None:  # the config classes' patterns: Gemma 2 alternates, Gemma 3 five local : one global
        pattern = int(d.get("sliding_window_pattern") or _GEMMA3_WINDOW_PATTERN) if gemma3 else 2
        layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if len(layer_types) != layers or set(layer_types) - {"sliding_attention", "full_attention"}:
        raise ValueError(f"layer_types must name sliding_attention or full_attention for each of the {layers} layers")
    theta, scaling, local_theta = _parse_gemma_rope(d, gemma3)
    window = _default(d, "sliding_window", 4096)
    attention_bias = bool(d.get("attention_bias", False))
    heads = int(_require(d, "num_attention_heads"))
    return ModelArch(
        architecture=architecture, vocab_size=int(_require(d, "vocab_size")),
        hidden_size=int(_require(d, "hidden_size")), intermediate_size=int(_require(d, "intermediate_size")),
        num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=int(d.get("num_key_value_heads") or heads), head_dim=int(d.get("head_dim") or 256),
        norm_eps=float(d.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=int(d.get("max_position_embeddings") or (131072 if gemma3 else 8192)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", True)), attention_bias=attention_bias,
        bos_token_id=d.get("bos_token_id", 2), eos_token_ids=_eos_ids(d.get("eos_token_id", 1)),
        torch_dtype=d.get("torch_dtype") or d.get("dtype"), o_proj_bias=attention_bias,
        sliding_window=None if window is None else int(window), layer_types=tuple(layer_types),
        hidden_act=act, norm_weight_offset=1.0, sandwich_norm=True, qk_norm=gemma3,
        embedding_multiplier=float(int(_require(d, "hidden_size")) ** 0.5),
        final_logit_softcapping=_optional_float(_default(d, "final_logit_softcapping", None if gemma3 else 30.0)),
        attn_logit_softcapping=_optional_float(_default(d, "attn_logit_softcapping", None if gemma3 else 50.0)),
        query_pre_attn_scalar=float(d.get("query_pre_attn_scalar") or 256),
        rope_local_theta=local_theta,
    )


def _parse_gemma_rope(d: dict, gemma3: bool) -> tuple[float, Optional[dict], Optional[float]]:
    """(rope_theta, rope_scaling, local theta) of the full-attention and sliding layers. Gemma 3's
    transformers 5.x layout keys rope_parameters by layer type; its Hub layout says rope_theta,
    rope_scaling (full layers only) and rope_local_base_freq."""
    if not gemma3:
        theta, scaling = _parse_rope(d)
        return theta, scaling, None
    params = d.get("rope_parameters") or {}
    if "full_attention" in params:
        theta, scaling = _parse_rope({"rope_parameters": params["full_attention"], **_max_len(d)})
        local = dict(params.get("sliding_attention") or {"rope_theta": _GEMMA3_LOCAL_THETA})
        local_theta, local_scaling = _parse_rope({"rope_parameters": local})
        if local_scaling is not None:
            raise ValueError("unsupported Gemma 3 rope scaling on the sliding-window layers")
        return theta, scaling, local_theta
    theta, scaling = _parse_rope({**d, "rope_theta": d.get("rope_theta", _GEMMA3_THETA)})
    return theta, scaling, float(d.get("rope_local_base_freq", _GEMMA3_LOCAL_THETA))


def _max_len(d: dict) -> dict:
    return {"max_position_embeddings": d["max_position_embeddings"]} if "max_position_embeddings" in d else {}


def _optional_float(v: Any) -> Optional[float]:
    return None if v is None else float(v)


def _int_if_whole(v: float) -> Any:
    return int(v) if float(v).is_integer() else v


def _write_gemma(a: ModelArch) -> dict:
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": a.rope_theta, **(a.rope_scaling or {})}
    if a.architecture == "Gemma3ForCausalLM":
        rope = {"full_attention": rope,
                "sliding_attention": {"rope_type": "default", "rope_theta": a.rope_local_theta}}
    return {
        "hidden_size": a.hidden_size, "intermediate_size": a.intermediate_size,
        "num_hidden_layers": a.num_hidden_layers, "num_attention_heads": a.num_attention_heads,
        "num_key_value_heads": a.num_key_value_heads, "head_dim": a.head_dim, "hidden_activation": a.hidden_act,
        "rms_norm_eps": a.norm_eps, "rope_parameters": rope, "max_position_embeddings": a.max_position_embeddings,
        "attention_bias": a.attention_bias, "sliding_window": a.sliding_window, "layer_types": list(a.layer_types),
        "query_pre_attn_scalar": _int_if_whole(a.query_pre_attn_scalar or a.head_dim),
        "final_logit_softcapping": a.final_logit_softcapping, "attn_logit_softcapping": a.attn_logit_softcapping,
    }


# -- Phi-3 ----------------------------------------------------------------------------------------

_PHI3_ORIGINAL_MAX_LEN = 4096  # Phi3Config's original_max_position_embeddings default


def _parse_phi3(architecture: str, d: dict) -> ModelArch:
    """Llama's layout with fused qkv_proj / gate_up_proj (split at load by the model) and LongRoPE."""
    plain = {k: v for k, v in d.items() if k not in ("rope_scaling", "rope_parameters", "mlp_bias",
                                                     "attention_bias", "sliding_window")}
    rope_theta, rope_scaling = _parse_longrope(d)
    base = _parse_llama_family("LlamaForCausalLM", {**plain, "rope_theta": rope_theta})
    window = d.get("sliding_window")
    return replace(base, architecture=architecture, rope_scaling=rope_scaling,
                   sliding_window=None if window is None else int(window))


def _parse_longrope(d: dict) -> tuple[float, Optional[dict]]:
    """(rope_theta, rope_scaling) with rope_scaling {"rope_type": "longrope", short_factor,
    long_factor, original_max_position_embeddings, attention_factor} or None (plain RoPE).
    HF's rules: "su" and "yarn" name LongRoPE on Phi-3; the top-level
    original_max_position_embeddings wins; attention_factor defaults to
    sqrt(1 + ln(factor) / ln(original)) with factor = max_position_embeddings / original."""
    params = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", None) or d.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type in ("su", "yarn"):
        rope_type = "longrope"
    if rope_type == "default":
        return theta, None
    if rope_type != "longrope":
        raise ValueError(f"unsupported Phi-3 rope type {rope_type!r}; supported: default, longrope (su)")
    half = int(d.get("head_dim") or int(_require(d, "hidden_size")) // int(_require(d, "num_attention_heads"))) // 2
    factors = {}
    for key in ("short_factor", "long_factor"):
        value = params.get(key)
        if not isinstance(value, (list, tuple)) or len(value) != half:
            raise ValueError(f"Phi-3 longrope needs {key} as a list of {half} numbers (head_dim / 2)")
        factors[key] = [float(v) for v in value]
    original = int(d.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
                   or _PHI3_ORIGINAL_MAX_LEN)
    factor = params.get("factor") or int(d.get("max_position_embeddings", 4096)) / original
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return theta, {"rope_type": "longrope", **factors, "original_max_position_embeddings": original,
                   "attention_factor": float(attention_factor)}


def _write_phi3(a: ModelArch) -> dict:
    d = _write_llama_family(replace(a, architecture="LlamaForCausalLM", rope_scaling=None))
    for key in ("attention_bias", "mlp_bias"):
        d.pop(key, None)
    if a.rope_scaling is not None:
        d["rope_parameters"] = {"rope_theta": a.rope_theta, **a.rope_scaling}
        d["original_max_position_embeddings"] = a.rope_scaling["original_max_position_embeddings"]
    d["sliding_window"] = a.sliding_window
    return d


register_families({
    "BaichuanForCausalLM": (_parse_baichuan, _write_baichuan),
    "Gemma2ForCausalLM": (_parse_gemma, _write_gemma),
    "Gemma3ForCausalLM": (_parse_gemma, _write_gemma),
    "Phi3ForCausalLM": (_parse_phi3, _write_phi3),
})
