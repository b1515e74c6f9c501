"""ModelArch: the architecture facts our model code needs, parsed from an HF config.json dict.

Pure Python (no torch) so that the engine can size the KV cache and read EOS ids without a model.
What varies between families is a field here (position encoding, norm kind, MLP kind, qk-norm,
tied embeddings, softcapping, embedding scaling), so model code reads the arch instead of testing
class names. Each family has one parser (config.json -> ModelArch) and one writer (ModelArch ->
config.json of the HF class, for the HF twin), kept in `_FAMILIES`: this module's own (Llama family,
GPT-2, Bloom, MoE) and those models/arch_dense.py registers (Baichuan, Gemma, Phi-3). The package
tritongen.models imports arch_dense, so the table is complete wherever this module is imported.
Both config.json layouts are accepted for RoPE families: the classic one (top-level `rope_theta` /
`rope_scaling`, as on the Hub) and the transformers 5.x one (`rope_parameters`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                           "GPT2LMHeadModel", "BloomForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM",
                           "BaichuanForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM")

# HF model_type of each architecture, for configs that lack "architectures" and for to_hf_config.
_MODEL_TYPES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "GPT2LMHeadModel": "gpt2",
    "BloomForCausalLM": "bloom",
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "BaichuanForCausalLM": "baichuan",  # remote code only: no transformers class
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Phi3ForCausalLM": "phi3",
}
LLAMA_FAMILY = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
"""Decoders of the Llama layout (RMSNorm, RoPE, gated SiLU MLP): one model class, one TP sharding."""
MOE_FAMILY = {"MixtralForCausalLM": "MistralForCausalLM", "Qwen3MoeForCausalLM": "Qwen3ForCausalLM"}
"""Mixture-of-Experts decoders -> the dense Llama-family architecture of their attention."""
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
    """Shapes and options of a decoder-only transformer. Field names follow HF config.json (the
    Llama names where families differ: GPT-2's n_embd is hidden_size, n_head num_attention_heads)."""

    architecture: str
    """HF class name, one of SUPPORTED_ARCHITECTURES."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    norm_eps: float
    """Epsilon of every norm (rms_norm_eps, or layer_norm_epsilon for LayerNorm families)."""
    rope_theta: Optional[float]
    """None when position_encoding is not "rope"."""
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
    position_encoding: str = "rope"
    """"rope" (rotary on q and k), "learned" (absolute position embeddings added to the input,
    GPT-2) or "alibi" (a per-head linear bias on the attention scores, Bloom)."""
    norm: str = "rms"
    """"rms" (RMSNorm) or "layer" (LayerNorm)."""
    norm_bias: bool = False
    """The norms carry a bias (LayerNorm families)."""
    norm_weight_offset: float = 0.0
    """RMSNorm scales by (offset + weight), in float32 before the cast back (Gemma: 1, its weights
    are stored around 0); 0 = Llama's weight * norm(x).to(dtype)."""
    mlp: str = "gated"
    """"gated": down(act(gate(x)) * up(x)) (Llama); "plain": c_proj(act(c_fc(x))) (GPT-2)."""
    hidden_act: str = "silu"
    """The MLP activation by its HF name: silu, gelu_new (tanh formula), gelu_pytorch_tanh, gelu;
    bloom_gelu for Bloom's own tanh formula (its config names none)."""
    qk_norm: bool = False
    """RMSNorm over head_dim on each query and key head before rotary (Qwen3)."""
    final_logit_softcapping: Optional[float] = None
    """logits = cap * tanh(logits / cap) when set (Gemma 2)."""
    embedding_multiplier: Optional[float] = None
    """The input embedding is multiplied by this when set, rounded to the model dtype first as HF
    does (Gemma: sqrt(hidden_size))."""
    num_experts: int = 0
    """Routed experts of each MoE layer (num_local_experts / num_experts); 0 = a dense model."""
    num_experts_per_tok: int = 0
    """Experts each token is routed to (top-k over the router's softmax)."""
    moe_intermediate_size: int = 0
    """Each expert's intermediate size (Mixtral: intermediate_size; Qwen3-MoE: moe_intermediate_size)."""
    norm_topk_prob: bool = True
    """Renormalize the top-k routing weights to sum to 1 (Mixtral always; Qwen3-MoE's norm_topk_prob)."""
    decoder_sparse_step: int = 1
    """Layer i is MoE when (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers."""
    mlp_only_layers: tuple[int, ...] = ()
    """Layers with a dense MLP of intermediate_size despite the step (Qwen3-MoE)."""
    layer_types: tuple[str, ...] = ()
    """Per layer "sliding_attention" or "full_attention" (Gemma 2/3's layer_types): when set, it
    says which layers use sliding_window (max_window_layers is then unused)."""
    attn_logit_softcapping: Optional[float] = None
    """Attention scores s (after the scale) become cap * tanh(s / cap) when set (Gemma 2)."""
    query_pre_attn_scalar: Optional[float] = None
    """The attention scale is query_pre_attn_scalar ** -0.5 when set (Gemma), else head_dim ** -0.5."""
    rope_local_theta: Optional[float] = None
    """RoPE base of the sliding-window layers when set (Gemma 3's rope_local_base_freq; plain RoPE
    there); rope_theta and rope_scaling are then the full-attention layers'."""
    sandwich_norm: bool = False
    """Each sublayer's output is normed before its residual add, and the MLP input by its own norm
    (Gemma 2/3: post_attention_layernorm, pre_ and post_feedforward_layernorm)."""
    normalized_lm_head: bool = False
    """lm_head's rows are L2-normalized when loaded (Baichuan2's NormHead)."""

    @classmethod
    def from_hf_config(cls, d: dict) -> "ModelArch":
        """Parse an HF config.json dict; ValueError names what is unsupported or missing."""
        architecture = _architecture_of(d)
        parse, _ = _family(architecture)
        return parse(architecture, d)

    def is_moe_layer(self, layer_idx: int) -> bool:
        return (self.num_experts > 0 and layer_idx not in self.mlp_only_layers
                and (layer_idx + 1) % self.decoder_sparse_step == 0)

    def layer_sliding_window(self, layer_idx: int) -> Optional[int]:
        if self.sliding_window is None:
            return None
        if self.layer_types:
            return self.sliding_window if self.layer_types[layer_idx] == "sliding_attention" else None
        return None if layer_idx < self.max_window_layers else self.sliding_window

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def to_hf_config(self) -> dict:
        """A config.json dict (transformers 5.x layout) that loads into the matching HF class."""
        _, write = _family(self.architecture)
        d = write(self)
        d.update({"architectures": [self.architecture], "model_type": _MODEL_TYPES[self.architecture],
                  "vocab_size": self.vocab_size, "tie_word_embeddings": self.tie_word_embeddings,
                  "bos_token_id": self.bos_token_id, "eos_token_id": _eos_json(self.eos_token_ids)})
        if self.torch_dtype is not None:
            d["dtype"] = self.torch_dtype
        return d


# -- Llama family (Llama, Mistral, Qwen2, Qwen3) ------------------------------------------------------

def _parse_llama_family(architecture: str, d: dict) -> ModelArch:
    _check_supported_options(d)
    heads = int(_require(d, "num_attention_heads"))
    hidden = int(_require(d, "hidden_size"))
    rope_theta, rope_scaling = _parse_rope(d)
    sliding_window, max_window_layers = _parse_sliding_window(architecture, d)
    is_qwen2 = architecture == "Qwen2ForCausalLM"
    # Llama and Qwen3 apply attention_bias to q/k/v and o_proj; Qwen2 always has q/k/v bias only.
    biased_o = architecture in ("LlamaForCausalLM", "Qwen3ForCausalLM")
    attention_bias = True if is_qwen2 else bool(biased_o and d.get("attention_bias", False))
    # Qwen3Config's head_dim default is 128, not hidden // heads.
    default_head_dim = 128 if architecture == "Qwen3ForCausalLM" else hidden // heads
    return ModelArch(
        architecture=architecture,
        vocab_size=int(_require(d, "vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(_require(d, "intermediate_size")),
        num_hidden_layers=int(_require(d, "num_hidden_layers")),
        num_attention_heads=heads,
        num_key_value_heads=int(d.get("num_key_value_heads") or heads),
        head_dim=int(d.get("head_dim") or default_head_dim),
        norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        attention_bias=attention_bias,
        bos_token_id=d.get("bos_token_id"),
        eos_token_ids=_eos_ids(d.get("eos_token_id")),
        torch_dtype=d.get("torch_dtype") or d.get("dtype"),
        o_proj_bias=attention_bias and biased_o,
        mlp_bias=bool(architecture == "LlamaForCausalLM" and d.get("mlp_bias", False)),
        sliding_window=sliding_window,
        max_window_layers=max_window_layers,
        qk_norm=architecture == "Qwen3ForCausalLM",
    )


def _write_llama_family(a: ModelArch) -> dict:
    rope = {"rope_type": "default", "rope_theta": a.rope_theta}
    if a.rope_scaling is not None:
        rope.update(a.rope_scaling)
    d: dict[str, Any] = {
        "hidden_size": a.hidden_size,
        "intermediate_size": a.intermediate_size,
        "num_hidden_layers": a.num_hidden_layers,
        "num_attention_heads": a.num_attention_heads,
        "num_key_value_heads": a.num_key_value_heads,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": a.norm_eps,
        "rope_parameters": rope,
        "max_position_embeddings": a.max_position_embeddings,
    }
    if a.architecture == "LlamaForCausalLM":
        d.update(attention_bias=a.attention_bias, mlp_bias=a.mlp_bias)
    elif a.architecture == "MistralForCausalLM":
        d.update(sliding_window=a.sliding_window)
    else:
        d.update(use_sliding_window=a.sliding_window is not None, sliding_window=a.sliding_window,
                 max_window_layers=a.max_window_layers)
        if a.architecture == "Qwen3ForCausalLM":
            d.update(attention_bias=a.attention_bias)
    return d


# -- GPT-2 ----------------------------------------------------------------------------------------

_GELU_ACTS = ("gelu_new", "gelu_pytorch_tanh", "gelu")


def _parse_gpt2(architecture: str, d: dict) -> ModelArch:
    act = d.get("activation_function", "gelu_new")
    if act not in _GELU_ACTS:
        raise ValueError(f"unsupported GPT-2 activation_function {act!r}; supported: {', '.join(_GELU_ACTS)}")
    # These change the attention scale per layer or drop it; no released GPT-2 checkpoint uses them.
    if d.get("scale_attn_by_inverse_layer_idx") or d.get("scale_attn_weights", True) is False:
        raise ValueError("unsupported GPT-2 attention scaling (scale_attn_by_inverse_layer_idx / "
                         "scale_attn_weights=false): only 1/sqrt(head_dim) is implemented")
    if d.get("add_cross_attention"):
        raise ValueError("unsupported GPT-2 option add_cross_attention: decoder-only models only")
    hidden, heads = int(_require(d, "n_embd")), int(_require(d, "n_head"))
    return ModelArch(
        architecture=architecture, vocab_size=int(_require(d, "vocab_size")), hidden_size=hidden,
        intermediate_size=int(d.get("n_inner") or 4 * hidden), num_hidden_layers=int(_require(d, "n_layer")),
        num_attention_heads=heads, num_key_value_heads=heads, head_dim=hidden // heads,
        norm_eps=float(d.get("layer_norm_epsilon", 1e-5)), rope_theta=None, rope_scaling=None,
        max_position_embeddings=int(d.get("n_positions", 1024)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", True)), attention_bias=True,
        bos_token_id=d.get("bos_token_id"), eos_token_ids=_eos_ids(d.get("eos_token_id")),
        torch_dtype=d.get("torch_dtype") or d.get("dtype"), o_proj_bias=True, mlp_bias=True,
        position_encoding="learned", norm="layer", norm_bias=True, mlp="plain", hidden_act=act,
    )


def _write_gpt2(a: ModelArch) -> dict:
    return {"n_embd": a.hidden_size, "n_inner": a.intermediate_size, "n_layer": a.num_hidden_layers,
            "n_head": a.num_attention_heads, "layer_norm_epsilon": a.norm_eps,
            "n_positions": a.max_position_embeddings, "activation_function": a.hidden_act}


# -- Bloom ----------------------------------------------------------------------------------------

_BLOOM_DEFAULT_MAX_LEN = 2048
"""Bloom's training length: ALiBi has no position table, so config.json states no maximum."""


def _parse_bloom(architecture: str, d: dict) -> ModelArch:
    if d.get("apply_residual_connection_post_layernorm"):
        raise ValueError("unsupported Bloom option apply_residual_connection_post_layernorm=true "
                         "(no released Bloom checkpoint uses it)")
    if d.get("slow_but_exact") and int(d.get("pretraining_tp", 1)) > 1:
        raise ValueError("unsupported Bloom option slow_but_exact with pretraining_tp > 1")
    hidden = int(d.get("hidden_size") or _require(d, "n_embed"))  # n_embed: old configs' name
    heads = int(d.get("n_head") or _require(d, "num_attention_heads"))
    return ModelArch(
        architecture=architecture, vocab_size=int(_require(d, "vocab_size")), hidden_size=hidden,
        intermediate_size=4 * hidden, num_hidden_layers=int(d.get("n_layer") or _require(d, "num_hidden_layers")),
        num_attention_heads=heads, num_key_value_heads=heads, head_dim=hidden // heads,
        norm_eps=float(d.get("layer_norm_epsilon", 1e-5)), rope_theta=None, rope_scaling=None,
        max_position_embeddings=int(d.get("seq_length") or _BLOOM_DEFAULT_MAX_LEN),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", True)), attention_bias=True,
        bos_token_id=d.get("bos_token_id"), eos_token_ids=_eos_ids(d.get("eos_token_id")),
        torch_dtype=d.get("torch_dtype") or d.get("dtype"), o_proj_bias=True, mlp_bias=True,
        position_encoding="alibi", norm="layer", norm_bias=True, mlp="plain", hidden_act="bloom_gelu",
    )


def _write_bloom(a: ModelArch) -> dict:
    return {"hidden_size": a.hidden_size, "n_layer": a.num_hidden_layers, "n_head": a.num_attention_heads,
            "layer_norm_epsilon": a.norm_eps, "seq_length": a.max_position_embeddings}


# -- Mixture of Experts (Mixtral, Qwen3-MoE) ---------------------------------------------------------

def _parse_moe(architecture: str, d: dict) -> ModelArch:
    """The dense twin's parse (attention, norms, rope) plus the routing fields."""
    dense = dict(d)
    mixtral = architecture == "MixtralForCausalLM"
    if mixtral:
        dense.setdefault("sliding_window", None)  # MixtralConfig's default (MistralConfig's is 4096)
    elif not dense.get("head_dim"):  # Qwen3MoeConfig has no head_dim default: HF uses hidden // heads
        dense["head_dim"] = int(_require(d, "hidden_size")) // int(_require(d, "num_attention_heads"))
    base = _parse_llama_family(MOE_FAMILY[architecture], dense)
    # Hub Qwen3-MoE configs say num_experts; transformers 5.x writes num_local_experts for both.
    experts = int(d.get("num_local_experts") or d.get("num_experts") or (8 if mixtral else 128))
    top_k = int(d.get("num_experts_per_tok") or (2 if mixtral else 8))
    if not 0 < top_k <= experts:
        raise ValueError(f"num_experts_per_tok {top_k} must be in [1, {experts}] (the number of experts)")
    if d.get("shared_expert_intermediate_size"):
        raise ValueError("unsupported option shared_expert_intermediate_size: no shared experts in Qwen3-MoE")
    return replace(
        base, architecture=architecture, num_experts=experts, num_experts_per_tok=top_k,
        moe_intermediate_size=int(base.intermediate_size if mixtral else d.get("moe_intermediate_size") or 768),
        norm_topk_prob=True if mixtral else bool(d.get("norm_topk_prob", False)),
        decoder_sparse_step=1 if mixtral else int(d.get("decoder_sparse_step") or 1),
        mlp_only_layers=() if mixtral else tuple(int(i) for i in d.get("mlp_only_layers") or ()),
    )


def _write_moe(a: ModelArch) -> dict:
    d = _write_llama_family(replace(a, architecture=MOE_FAMILY[a.architecture]))
    d.update(num_local_experts=a.num_experts, num_experts_per_tok=a.num_experts_per_tok)
    if a.architecture == "Qwen3MoeForCausalLM":
        d.update(moe_intermediate_size=a.moe_intermediate_size, norm_topk_prob=a.norm_topk_prob,
                 decoder_sparse_step=a.decoder_sparse_step, mlp_only_layers=list(a.mlp_only_layers))
    return d


Family = tuple[Callable[[str, dict], ModelArch], Callable[[ModelArch], dict]]
"""(config.json parser, config.json writer) of one architecture."""

_FAMILIES: dict[str, Family] = {
    **{name: (_parse_llama_family, _write_llama_family) for name in LLAMA_FAMILY},
    "GPT2LMHeadModel": (_parse_gpt2, _write_gpt2),
    "BloomForCausalLM": (_parse_bloom, _write_bloom),
    **{name: (_parse_moe, _write_moe) for name in MOE_FAMILY},
}
"""architecture -> its Family; register_families adds the rest of SUPPORTED_ARCHITECTURES."""


def register_families(families: dict[str, Family]) -> None:
    """Add the parser and writer of supported architectures that have none yet (each once)."""
    for name in families:
        if name not in SUPPORTED_ARCHITECTURES:
            raise unsupported_architecture_error(name)
        if name in _FAMILIES:
            raise ValueError(f"architecture {name!r} already has a config.json parser")
    _FAMILIES.update(families)


def _family(architecture: str) -> Family:
    if architecture not in _FAMILIES:
        raise LookupError(f"no config.json parser registered for {architecture!r} "
                          "(import tritongen.models.arch_dense: it registers Baichuan, Gemma and Phi-3)")
    return _FAMILIES[architecture]


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
    if architecture in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and d.get("use_sliding_window"):
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
