"""ModelArch: the architecture facts our model code needs, parsed from an HF config.json dict.

Pure Python (no torch) so that the engine can size the KV cache and read EOS ids without a model.
Both config.json layouts are accepted: the classic one (top-level `rope_theta` / `rope_scaling`, as
on the Hub) and the transformers 5.x one (`rope_parameters` holding rope_theta and rope_type).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")

# HF model_type of each architecture, for configs that lack "architectures" and for to_hf_config.
_MODEL_TYPES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}
_ARCH_BY_MODEL_TYPE = {v: k for k, v in _MODEL_TYPES.items()}

# Keys each supported rope_type needs besides rope_theta (HF's validation uses the same sets).
_ROPE_REQUIRED = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}
_DEFAULT_ROPE_THETA = 10000.0
_MISTRAL_DEFAULT_WINDOW = 4096  # MistralConfig's default when config.json has no sliding_window key


def unsupported_architecture_error(name: object) -> ValueError:
    return ValueError(
        f"unsupported model architecture {name!r}; supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


@dataclass(frozen=True)
class ModelArch:
    """Shapes and options of a Llama-family decoder. Field names follow HF config.json."""

    architecture: str
    """HF class name, one of SUPPORTED_ARCHITECTURES."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Optional[dict] = field(hash=False)
    """None for plain RoPE, else {"rope_type": "linear" | "llama3", ...that type's parameters}."""
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    """q/k/v projections carry a bias (always for Qwen2)."""
    bos_token_id: Optional[int]
    eos_token_ids: tuple[int, ...]
    torch_dtype: Optional[str]
    """Checkpoint dtype as config.json names it ("bfloat16", ...), or None."""
    o_proj_bias: bool = False
    """o_proj carries a bias: Llama's attention_bias covers o_proj too, Qwen2's q/k/v bias does not."""
    mlp_bias: bool = False
    """Llama's mlp_bias: gate/up/down projections carry a bias."""
    sliding_window: Optional[int] = None
    """Each query sees at most this many keys (itself included); None = full causal attention."""
    max_window_layers: int = 0
    """Layers with index >= this use sliding_window (Qwen2's convention; Mistral: all layers)."""

    @classmethod
    def from_hf_config(cls, d: dict) -> "ModelArch":
        """Parse an HF config.json dict; ValueError names what is unsupported or missing."""
        architecture = _architecture_of(d)
        _check_supported_options(d)
        heads = int(_require(d, "num_attention_heads"))
        hidden = int(_require(d, "hidden_size"))
        rope_theta, rope_scaling = _parse_rope(d)
        sliding_window, max_window_layers = _parse_sliding_window(architecture, d)
        is_qwen2 = architecture == "Qwen2ForCausalLM"
        is_llama = architecture == "LlamaForCausalLM"
        attention_bias = True if is_qwen2 else bool(is_llama and d.get("attention_bias", False))
        return cls(
            architecture=architecture,
            vocab_size=int(_require(d, "vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(_require(d, "intermediate_size")),
            num_hidden_layers=int(_require(d, "num_hidden_layers")),
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or hidden // heads),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=_eos_ids(d.get("eos_token_id")),
            torch_dtype=d.get("torch_dtype") or d.get("dtype"),
            o_proj_bias=attention_bias and is_llama,
            mlp_bias=bool(is_llama and d.get("mlp_bias", False)),
            sliding_window=sliding_window,
            max_window_layers=max_window_layers,
        )

    def layer_sliding_window(self, layer_idx: int) -> Optional[int]:
        if self.sliding_window is None or layer_idx < self.max_window_layers:
            return None
        return self.sliding_window

    def to_hf_config(self) -> dict:
        """A config.json dict (transformers 5.x layout) that loads into the matching HF class."""
        rope = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            rope.update(self.rope_scaling)
        d: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": _MODEL_TYPES[self.architecture],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": rope,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": _eos_json(self.eos_token_ids),
        }
        d.update(self._hf_arch_specific())
        if self.torch_dtype is not None:
            d["dtype"] = self.torch_dtype
        return d

    def _hf_arch_specific(self) -> dict:
        if self.architecture == "LlamaForCausalLM":
            return {"attention_bias": self.attention_bias, "mlp_bias": self.mlp_bias}
        if self.architecture == "MistralForCausalLM":
            return {"sliding_window": self.sliding_window}
        return {
            "use_sliding_window": self.sliding_window is not None,
            "sliding_window": self.sliding_window,
            "max_window_layers": self.max_window_layers,
        }


def _require(d: dict, key: str) -> Any:
    if d.get(key) is None:
        raise ValueError(f"model config.json lacks required field {key!r}")
    return d[key]


def _architecture_of(d: dict) -> str:
    names = d.get("architectures") or []
    if names:
        name = names[0]
    elif d.get("model_type") in _ARCH_BY_MODEL_TYPE:
        name = _ARCH_BY_MODEL_TYPE[d["model_type"]]
    else:
        name = d.get("model_type", "<no architectures or model_type in config>")
    if name not in SUPPORTED_ARCHITECTURES:
        raise unsupported_architecture_error(name)
    return name


def _check_supported_options(d: dict) -> None:
    act = d.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"unsupported hidden_act {act!r}: only silu is implemented")
    prf = d.get("partial_rotary_factor") or (d.get("rope_parameters") or {}).get("partial_rotary_factor")
    if prf not in (None, 1, 1.0):
        raise ValueError(f"unsupported partial_rotary_factor {prf!r}: only full rotary is implemented")


def _parse_rope(d: dict) -> tuple[float, Optional[dict]]:
    """(rope_theta, rope_scaling) from either config layout; rope_scaling None means plain RoPE."""
    params = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    theta = params.pop("rope_theta", None)
    if theta is None:
        theta = d.get("rope_theta", _DEFAULT_ROPE_THETA)
    # Old configs spell the type as "type"; HF reads rope_type first.
    rope_type = params.pop("rope_type", None) or params.get("type") or "default"
    params.pop("type", None)
    params.pop("partial_rotary_factor", None)
    if rope_type == "default":
        return float(theta), None
    if rope_type not in _ROPE_REQUIRED:
        raise ValueError(
            f"unsupported rope type {rope_type!r}; supported: default, {', '.join(_ROPE_REQUIRED)}"
        )
    if rope_type == "llama3":
        # HF falls back to max_position_embeddings the same way.
        params.setdefault("original_max_position_embeddings", d.get("max_position_embeddings"))
    missing = [k for k in _ROPE_REQUIRED[rope_type] if params.get(k) is None]
    if missing:
        raise ValueError(f"rope type {rope_type!r} needs {missing} in rope_scaling / rope_parameters")
    return float(theta), {"rope_type": rope_type, **params}


def _parse_sliding_window(architecture: str, d: dict) -> tuple[Optional[int], int]:
    if architecture == "MistralForCausalLM":
        window = d["sliding_window"] if "sliding_window" in d else _MISTRAL_DEFAULT_WINDOW
        return (None if window is None else int(window)), 0
    if architecture == "Qwen2ForCausalLM" and d.get("use_sliding_window"):
        # Qwen2Config defaults; HF ignores sliding_window unless use_sliding_window is set.
        window = d.get("sliding_window") or 4096
        return int(window), int(d.get("max_window_layers", 28))
    return None, 0


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def _eos_json(ids: tuple[int, ...]) -> Any:
    if not ids:
        return None
    return ids[0] if len(ids) == 1 else list(ids)
