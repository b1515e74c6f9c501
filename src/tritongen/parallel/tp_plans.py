"""Which modules of each family split over tensor-parallel ranks, and how: one TPPlan per family.

A plan names modules by attribute path and says what their split features are (a `kind`):
- column-parallel modules keep a slice of their output features (weight rows, bias): whole query
  heads (Q), the KV heads those read (KV), whole heads of a per-head interleaved [q_h | k_h | v_h]
  projection (QKV: Bloom's query_key_value), or a slice of the MLP's intermediate features (MLP);
- row-parallel modules keep the matching slice of their input features (weight columns); their
  partial outputs are summed over the ranks and their bias is added once;
- an MoE block keeps every expert, each with a slice of its intermediate features (EXPERT): the
  router stays whole and one all-reduce follows the weighted sum of the experts;
- the token embedding and lm_head split the vocabulary (VOCAB); everything else every rank keeps
  whole (norms, qk-norm weights, GPT-2's position table, the router), and a matrix of that kind
  must be declared in `replicated`, so that a plan that forgets a projection fails at load.

Fused checkpoint tensors (GPT-2's c_attn, Phi-3's qkv_proj / gate_up_proj, Baichuan's W_pack) are
split by the model's checkpoint_tensors into the parameters named here before a rank slices
them; a new family adds an entry to PLANS, not code. Pure Python (no torch), like models.arch.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from tritongen.models.arch import ModelArch

Q, KV, QKV, MLP, EXPERT, VOCAB = "q", "kv", "qkv", "mlp", "expert", "vocab"


@dataclass(frozen=True)
class TPPlan:
    """How one family's model splits. `layers`, `embed` and `final_norm` are paths from the model;
    the other paths are from one decoder layer."""

    layers: str
    """The decoder layers (an nn.ModuleList)."""
    embed: str
    """The token embedding (vocab-parallel; lm_head is too, tied to it when the arch says so)."""
    attention: str
    """The layer's attention module: its num_heads (and num_kv_heads, sizes where it has them)
    become the rank's."""
    column: dict[str, str] = field(hash=False)
    """Column-parallel Linear path -> the kind of its output features."""
    row: dict[str, str] = field(hash=False)
    """Row-parallel Linear path -> the kind of its input features."""
    reducing_norms: tuple[str, ...] = ()
    """RMSNorms whose add_forward follows a row-parallel layer (the Llama layout): on CUDA small
    batches leave the row-parallel sums unreduced and these norms reduce them in their kernel; the
    row-parallel layers then alternate the buffer's halves in `row` order. Empty: each row-parallel
    layer reduces its own output."""
    final_norm: Optional[str] = None
    """The model's last norm when it is one of those reducing norms."""
    experts: Optional[str] = None
    """The layer's MoE block (models.moe.SparseMoeBlock) where the layer has one."""
    replicated: tuple[str, ...] = ()
    """Paths (from a layer, or from the model) of matrices every rank keeps whole."""


_LLAMA = TPPlan(
    layers="model.layers", embed="model.embed_tokens", attention="self_attn",
    column={"self_attn.q_proj": Q, "self_attn.k_proj": KV, "self_attn.v_proj": KV,
            "mlp.gate_proj": MLP, "mlp.up_proj": MLP},
    row={"self_attn.o_proj": Q, "mlp.down_proj": MLP},
    reducing_norms=("input_layernorm", "post_attention_layernorm"), final_norm="model.norm",
)
_MOE = replace(_LLAMA, experts="mlp", replicated=("mlp.gate",))  # mlp_only_layers keep Llama's MLP
_GEMMA = replace(_LLAMA, reducing_norms=(), final_norm=None)  # sandwich norms, no fused residual add
_GPT2 = TPPlan(
    layers="transformer.h", embed="transformer.wte", attention="attn",
    column={"attn.q_proj": Q, "attn.k_proj": KV, "attn.v_proj": KV, "mlp.c_fc": MLP},
    row={"attn.c_proj": Q, "mlp.c_proj": MLP},
    replicated=("transformer.wpe",),
)
# query_key_value's rows are per head [q_h | k_h | v_h]: a rank's heads are one slice of them.
_BLOOM = TPPlan(
    layers="transformer.h", embed="transformer.word_embeddings", attention="self_attention",
    column={"self_attention.query_key_value": QKV, "mlp.dense_h_to_4h": MLP},
    row={"self_attention.dense": Q, "mlp.dense_4h_to_h": MLP},
)

PLANS: dict[str, TPPlan] = {
    "LlamaForCausalLM": _LLAMA,
    "MistralForCausalLM": _LLAMA,
    "Qwen2ForCausalLM": _LLAMA,
    "Qwen3ForCausalLM": _LLAMA,  # q_norm / k_norm: one weight shared by all heads, kept whole
    "Phi3ForCausalLM": _LLAMA,  # qkv_proj / gate_up_proj split into Llama's names at load
    "BaichuanForCausalLM": _LLAMA,  # W_pack split at load; the 13B's ALiBi slopes: the rank's heads'
    "Gemma2ForCausalLM": _GEMMA,
    "Gemma3ForCausalLM": _GEMMA,
    "MixtralForCausalLM": _MOE,
    "Qwen3MoeForCausalLM": _MOE,
    "GPT2LMHeadModel": _GPT2,  # Conv1D transposed and c_attn split at load
    "BloomForCausalLM": _BLOOM,
}
"""architecture -> its plan."""


def validate_tensor_parallel(arch: ModelArch, world_size: int) -> None:
    """ValueError if `arch` cannot be split over `world_size` ranks (whole heads per rank, equal
    slices of the MLP's and the experts' features, a family with a plan), naming what fails."""
    heads, kv_heads = arch.num_attention_heads, arch.num_key_value_heads
    if world_size < 1:
        raise ValueError(f"tensor parallel world_size must be >= 1, got {world_size}")
    if world_size > 1 and arch.architecture not in PLANS:
        raise ValueError(f"tensor parallelism has no sharding plan for {arch.architecture} (it splits "
                         f"{', '.join(PLANS)}); use tensor_parallel_size 1")
    if world_size > heads:
        raise ValueError(f"tensor parallel world_size {world_size} is larger than num_attention_heads "
                         f"{heads}: every rank needs at least one whole query head")
    if heads % world_size:
        raise ValueError(f"num_attention_heads {heads} is not divisible by tensor parallel world_size "
                         f"{world_size}")
    if kv_heads >= world_size and kv_heads % world_size:
        raise ValueError(f"num_key_value_heads {kv_heads} is not divisible by tensor parallel world_size "
                         f"{world_size}")
    if kv_heads < world_size and world_size % kv_heads:
        raise ValueError(f"tensor parallel world_size {world_size} is not a multiple of num_key_value_heads "
                         f"{kv_heads}: KV heads can only be replicated a whole number of times")
    moe = [arch.is_moe_layer(i) for i in range(arch.num_hidden_layers)]
    if not all(moe) and arch.intermediate_size % world_size:
        raise ValueError(f"intermediate_size {arch.intermediate_size} is not divisible by tensor parallel "
                         f"world_size {world_size}")
    if any(moe) and arch.moe_intermediate_size % world_size:
        raise ValueError(f"moe_intermediate_size {arch.moe_intermediate_size} (each expert's) is not divisible "
                         f"by tensor parallel world_size {world_size}")


def kv_heads_per_rank(arch: ModelArch, world_size: int) -> int:
    """KV heads in each rank's cache: a slice of them, or one replicated head when they are fewer
    than the ranks."""
    validate_tensor_parallel(arch, world_size)
    return max(1, arch.num_key_value_heads // world_size)


def vocab_slice(vocab_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """(start, padded per-rank size) of this rank's vocabulary slice."""
    per_rank = -(-vocab_size // world_size)
    return rank * per_rank, per_rank


def feature_slices(arch: ModelArch, rank: int, world_size: int) -> dict[str, tuple[int, int]]:
    """kind -> (start, size) of `rank`'s features of that kind in the full tensor's dimension."""
    validate_tensor_parallel(arch, world_size)
    d = arch.head_dim
    heads, kv_heads = arch.num_attention_heads // world_size, kv_heads_per_rank(arch, world_size)
    # Rank r's query heads read KV heads r*K/W onwards, also when K < W (then one replicated head).
    kv_start = rank * arch.num_key_value_heads // world_size
    inter, expert = arch.intermediate_size // world_size, arch.moe_intermediate_size // world_size
    return {Q: (rank * heads * d, heads * d), KV: (kv_start * d, kv_heads * d),
            QKV: (rank * heads * 3 * d, heads * 3 * d), MLP: (rank * inter, inter),
            EXPERT: (rank * expert, expert), VOCAB: vocab_slice(arch.vocab_size, rank, world_size)}
