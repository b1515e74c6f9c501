"""Presets of Baichuan / Baichuan2, Gemma 2, Gemma 3 text and Phi-3 (merged into presets.PRESETS).

The real shapes are their Hub config.json files (classic layout; Baichuan's as its remote code
reads them). The tiny ones share the default tokenizer's vocabulary (49152) and bos 1 / eos 2,
and choose values that make each feature act on short test prompts: small sliding windows,
softcaps the random logits reach, a LongRoPE boundary at 64 tokens.
"""
from __future__ import annotations

_BAICHUAN2_7B = {
    "_from_model_config": True,
    "architectures": ["BaichuanForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "model_max_length": 4096,
    "model_type": "baichuan",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "tokenizer_class": "BaichuanTokenizer",
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 125696,
    "z_loss_weight": 0,
}

# ALiBi: the 13B configs state model_max_length only (no max_position_embeddings).
_BAICHUAN2_13B = {
    "architectures": ["BaichuanForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "initializer_range": 0.02,
    "intermediate_size": 13696,
    "model_max_length": 4096,
    "model_type": "baichuan",
    "num_attention_heads": 40,
    "num_hidden_layers": 40,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 125696,
}

_GEMMA_2_9B = {
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 16,
    "num_hidden_layers": 42,
    "num_key_value_heads": 8,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "sliding_window_size": 4096,
    "torch_dtype": "float32",
    "use_cache": True,
    "vocab_size": 256000,
}

_PHI_3_MINI = {  # Phi-3-mini-4k-instruct
    "architectures": ["Phi3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "embd_pdrop": 0.0,
    "eos_token_id": 32000,
    "hidden_act": "silu",
    "hidden_size": 3072,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 4096,
    "model_type": "phi3",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096,
    "pad_token_id": 32000,
    "resid_pdrop": 0.0,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "sliding_window": 2047,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 32064,
}

_TINY = {"vocab_size": 49152, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "torch_dtype": "bfloat16"}

DENSE_PRESETS: dict[str, dict] = {
    # Baichuan2-7B's layout (RoPE, W_pack, NormHead: z_loss_weight marks Baichuan2).
    "tiny-baichuan": {**_BAICHUAN2_7B, **_TINY, "num_attention_heads": 4, "max_position_embeddings": 2048,
                      "model_max_length": 2048},
    # Baichuan2-13B's (ALiBi); 6 heads, not a power of two, like the real 40.
    "tiny-baichuan-13b": {**_BAICHUAN2_13B, **_TINY, "hidden_size": 96, "num_attention_heads": 6,
                          "model_max_length": 2048, "z_loss_weight": 0},
    # Alternating sliding (8 keys) and global layers; query_pre_attn_scalar 32 != head_dim 16.
    "tiny-gemma2": {**_GEMMA_2_9B, **_TINY, "num_hidden_layers": 4, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 16, "query_pre_attn_scalar": 32, "sliding_window": 8,
                    "sliding_window_size": 8, "attn_logit_softcapping": 4.0, "final_logit_softcapping": 8.0,
                    "max_position_embeddings": 2048, "torch_dtype": "bfloat16"},
    # Gemma 3's Hub layout: one global layer per two (sliding_window_pattern), local rope base
    # 10000 vs global 1e6 with linear scaling on the global layers only, qk-norm.
    "tiny-gemma3": {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", **_TINY,
                    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                    "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 16, "sliding_window": 8,
                    "sliding_window_pattern": 2, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                    "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rms_norm_eps": 1e-06,
                    "attn_logit_softcapping": None, "final_logit_softcapping": None,
                    "max_position_embeddings": 2048, "tie_word_embeddings": True, "attention_bias": False},
    # LongRoPE (Phi-3-mini-128k's layout) with its boundary at 64 tokens, GQA, a 32-key window.
    "tiny-phi3": {**_PHI_3_MINI, **_TINY, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "max_position_embeddings": 256, "original_max_position_embeddings": 64, "sliding_window": 32,
                  "rope_scaling": {"type": "longrope",
                                   "short_factor": [1.0, 1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 1.7],
                                   "long_factor": [1.0, 1.2, 1.6, 2.2, 3.0, 4.0, 5.5, 7.0]}},
    "baichuan2-7b": _BAICHUAN2_7B,
    "baichuan2-13b": _BAICHUAN2_13B,
    "gemma-2-9b": _GEMMA_2_9B,
    "phi-3-mini": _PHI_3_MINI,
}
