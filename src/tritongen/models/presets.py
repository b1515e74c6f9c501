"""Configs for `dummy:<preset>` models: random weights of a known shape, no download needed.

Tiny presets exist for tests: vocab 49152 and eos 2 / bos 1 match the default tokenizer
(SmolLM2's: 0 <|endoftext|>, 1 <|im_start|>, 2 <|im_end|>), so their output detokenizes. Each
varies one family feature: GQA vs MHA, tied embeddings, qkv bias, sliding window, rope scaling,
qk-norm (Qwen3), the GPT-2 layout (learned positions, LayerNorm, GELU), ALiBi (Bloom), MoE routing
(Mixtral, Qwen3-MoE).
The real shapes are the Hub config.json files verbatim (classic layout), for benchmarks.
"""
from __future__ import annotations

from typing import Any

from tritongen.models.presets_dense import DENSE_PRESETS


def _tiny(**overrides: Any) -> dict:
    base = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 49152,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    }
    base.update(overrides)
    return base


_LLAMA_2_7B = {
    "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "use_cache": True,
    "vocab_size": 32000,
}

_LLAMA_2_13B = {
    **_LLAMA_2_7B,
    "hidden_size": 5120,
    "intermediate_size": 13824,
    "num_attention_heads": 40,
    "num_hidden_layers": 40,
    "num_key_value_heads": 40,
}

_LLAMA_3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}

# The default model's shape (SmolLM2-135M-Instruct), for benchmarks without the checkpoint.
_SMOLLM2_135M = _tiny(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)

_QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 12288,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# GPT-2 small (124M) as on the Hub (no torch_dtype there: float32).
_GPT2 = {
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1,
    "bos_token_id": 50256,
    "embd_pdrop": 0.1,
    "eos_token_id": 50256,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "resid_pdrop": 0.1,
    "vocab_size": 50257,
}

# Bloom-7b1's shape as bigscience publishes it (250,880-token vocabulary, 30 layers, 32 heads).
_BLOOM_7B1 = {
    "apply_residual_connection_post_layernorm": False,
    "architectures": ["BloomForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_dropout": 0.0,
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "bloom",
    "n_head": 32,
    "n_layer": 30,
    "pad_token_id": 3,
    "pretraining_tp": 1,
    "slow_but_exact": False,
    "unk_token_id": 0,
    "use_cache": True,
    "vocab_size": 250880,
}

# Mixtral-8x7B-v0.1's config.json (8 experts, top-2, 46.7B parameters).
_MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 32000,
}

# Qwen3-30B-A3B's config.json (128 experts, top-8 renormalized, 3.3B active parameters).
_QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

PRESETS: dict[str, dict] = {
    "tiny-llama": _tiny(),
    "tiny-llama-mha": _tiny(num_key_value_heads=4, tie_word_embeddings=True),
    "tiny-qwen2": _tiny(
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
    ),
    # A small window so that short test prompts already cross it.
    "tiny-mistral": _tiny(
        architectures=["MistralForCausalLM"],
        model_type="mistral",
        sliding_window=16,
        rope_theta=1000000.0,
    ),
    # transformers 5.x layout: rope settings under rope_parameters; two EOS ids.
    "tiny-llama3": {
        **{k: v for k, v in _tiny().items() if k not in ("rope_theta", "rope_scaling")},
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024,
        },
        "eos_token_id": [2, 0],
    },
    # qk-norm; head_dim 32 with hidden 64 / 4 heads, so nothing may assume hidden // heads.
    "tiny-qwen3": _tiny(
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        head_dim=32,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
    ),
    # GPT-2 layout at the tiny size, with the default tokenizer's vocabulary and bos/eos ids.
    "tiny-gpt2": {**_GPT2, "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 2048, "n_ctx": 2048,
                  "vocab_size": 49152, "bos_token_id": 1, "eos_token_id": 2},
    # ALiBi; 6 heads, not a power of two, so the slopes' second sequence is used too.
    "tiny-bloom": {**_BLOOM_7B1, "hidden_size": 48, "n_head": 6, "n_layer": 2, "vocab_size": 49152,
                   "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "seq_length": 2048},
    # MoE: 4 experts, top-2 renormalized (Mixtral's rule), expert size 96.
    "tiny-mixtral": _tiny(architectures=["MixtralForCausalLM"], model_type="mixtral", intermediate_size=96,
                          num_local_experts=4, num_experts_per_tok=2, rope_theta=1000000.0, sliding_window=None),
    # MoE with qk-norm: 8 experts, top-3 without renormalization, layer 1 dense (mlp_only_layers,
    # intermediate_size 128) between MoE layers of expert size 48.
    "tiny-qwen3-moe": _tiny(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_hidden_layers=3,
                            head_dim=32, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=48,
                            norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1],
                            rope_theta=1000000.0, rms_norm_eps=1e-6, use_sliding_window=False),
    "smollm2-135m": _SMOLLM2_135M,
    "llama-2-7b": _LLAMA_2_7B,
    "llama-2-13b": _LLAMA_2_13B,
    # One rank of Llama-2-13B at tensor_parallel_size 2 (half the heads, the MLP and the vocab;
    # head_dim kept): TP=2's per-GPU work without its communication, a single-GPU bound for it.
    "llama-2-13b-tp2-rank": {**_LLAMA_2_13B, "num_attention_heads": 20, "num_key_value_heads": 20,
                             "head_dim": 128, "intermediate_size": 6912, "vocab_size": 16000},
    "llama-3-8b": _LLAMA_3_8B,
    "qwen3-8b": _QWEN3_8B,
    "gpt2": _GPT2,
    "bloom-7b1": _BLOOM_7B1,
    "mixtral-8x7b": _MIXTRAL_8X7B,
    "qwen3-30b-a3b": _QWEN3_30B_A3B,
    **DENSE_PRESETS,  # Baichuan, Gemma 2/3, Phi-3 (models/presets_dense.py)
}
