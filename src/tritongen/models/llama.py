"""Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM2) over a paged KV cache.

Parameter names equal HF's, so an HF state dict loads directly and ours loads into an HF twin.
The model sees one flat batch of tokens [T] from many sequences; AttentionMetadata says where each
sequence's tokens and cache blocks are. Norms, rotary and SiLU·mul dispatch through ops.kernels (reference, or Triton on CUDA).
"""
from __future__ import annotations

from typing import Any, Iterator, Optional

import torch
from torch import nn

from tritongen.models.arch import ModelArch
from tritongen.ops import kernels, reference
from tritongen.ops.attention import AttentionMetadata, rotary_attention
from tritongen.ops.fp8 import Fp8Linear, Fp8Tokens, stack_fp8


class Linear(nn.Linear):
    """nn.Linear whose product dispatches through ops.kernels (a Triton GEMM for decode batches on CUDA)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """Llama's RMSNorm; with `offset` (Gemma: 1) HF's Gemma formula instead: the scale is
    (offset + weight) and applies in float32, before the cast back (both fused on CUDA)."""

    def __init__(self, hidden_size: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.offset = offset

    def forward(self, x: torch.Tensor, quantize: bool = False) -> torch.Tensor | Fp8Tokens:
        """quantize: the output quantized per token (Fp8Tokens), for an fp8 projection that takes it so."""
        if quantize:
            return kernels.rms_norm_fp8(x, self.weight, self.eps, self.offset)
        return kernels.rms_norm(x, self.weight, self.eps, self.offset)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor,
                    quantize: bool = False) -> tuple[torch.Tensor | Fp8Tokens, torch.Tensor]:
        """(norm(x + residual), x + residual): the residual add fused into the norm; quantize as in forward."""
        if quantize:
            return kernels.add_rms_norm_fp8(x, residual, self.weight, self.eps, self.offset)
        return kernels.add_rms_norm(x, residual, self.weight, self.eps, self.offset)

    def forward_add_norm(self, x: torch.Tensor, residual: torch.Tensor, after: "RMSNorm"
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """(after(self(x) + residual), self(x) + residual) in one kernel: a sandwich norm (Gemma) whose
        output joins the residual stream right before the next norm. Both norms take this one's eps
        and offset (a model's norms share them)."""
        return kernels.norm_add_rms_norm(x, residual, self.weight, after.weight, self.eps, self.offset)


class RotaryEmbedding(nn.Module):
    """cos/sin for arbitrary positions, computed on the fly from a float32 inv_freq buffer.

    inv_freq must stay float32: build the model in its final dtype (as load_model does) rather than
    casting the whole module afterwards, or call reset_buffers() after a cast.
    """

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self._args = (arch.head_dim, arch.rope_theta, arch.rope_scaling)
        self.register_buffer("inv_freq", reference.rope_inv_freq(*self._args), persistent=False)

    def reset_buffers(self) -> None:
        # Computed on the CPU like HF, then moved: device pow() may differ in the last ulp.
        device = self.inv_freq.device if self.inv_freq.device.type != "meta" else torch.device("cpu")
        self.inv_freq = reference.rope_inv_freq(*self._args).to(device)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return reference.rope_cos_sin(positions, self.inv_freq)


class LlamaAttention(nn.Module):
    def __init__(self, arch: ModelArch, layer_idx: int) -> None:
        super().__init__()
        self.num_heads = arch.num_attention_heads
        self.num_kv_heads = arch.num_key_value_heads
        self.head_dim = arch.head_dim
        self.scale = arch.attention_scale
        self.sliding_window = arch.layer_sliding_window(layer_idx)
        self.logit_softcap = arch.attn_logit_softcapping
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = Linear(arch.hidden_size, q_size, bias=arch.attention_bias)
        self.k_proj = Linear(arch.hidden_size, kv_size, bias=arch.attention_bias)
        self.v_proj = Linear(arch.hidden_size, kv_size, bias=arch.attention_bias)
        self.o_proj = Linear(q_size, arch.hidden_size, bias=arch.o_proj_bias)
        self.qkv_proj: nn.Linear | None = None
        """q, k and v stacked into one GEMM by fuse_projections() (GPU); None = separate."""
        self.sizes = (q_size, kv_size, kv_size)
        # Qwen3: RMSNorm over head_dim of every q and k head (weights shared by the heads, so
        # tensor parallelism keeps them whole).
        norm = (lambda: RMSNorm(self.head_dim, arch.norm_eps, arch.norm_weight_offset)) if arch.qk_norm else None
        self.q_norm = norm() if norm else None
        self.k_norm = norm() if norm else None

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as [T, heads, head_dim], q and k normalized where the arch has qk-norm."""
        T, d = x.shape[0], self.head_dim
        if self.qkv_proj is None:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            q, k, v = q.view(T, -1, d), k.view(T, -1, d), v.view(T, -1, d)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            return q, k, v
        qkv = self.qkv_proj(x)
        if self.q_norm is not None:  # in place, in the stacked output: one kernel on CUDA
            kernels.qk_rms_norm_(qkv, self.q_norm.weight, self.k_norm.weight, self.sizes[0] // d,
                                 self.sizes[1] // d, d, self.q_norm.eps, self.q_norm.offset)
        q, k, v = qkv.split(self.sizes, dim=-1)
        return q.view(T, -1, d), k.view(T, -1, d), v.view(T, -1, d)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                kv_cache: torch.Tensor, attn: AttentionMetadata) -> torch.Tensor:
        T = x.shape[0]
        q, k, v = self._qkv(x)
        out = rotary_attention(q, k, v, cos, sin, kv_cache, attn, self.scale, self.sliding_window,
                               self.logit_softcap)
        return self.o_proj(out.reshape(T, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        h, i, bias = arch.hidden_size, arch.intermediate_size, arch.mlp_bias
        self.gate_proj = Linear(h, i, bias=bias)
        self.up_proj = Linear(h, i, bias=bias)
        self.down_proj = Linear(i, h, bias=bias)
        self.gate_up_proj: nn.Linear | None = None
        """gate and up stacked into one GEMM by fuse_projections() (GPU); None = separate."""
        self.act = arch.hidden_act
        """silu (fused kernels), or a GELU (GeGLU: Gemma), applied by kernels.activation_and_mul."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act not in ("silu", "swish"):
            gate, up = ((self.gate_proj(x), self.up_proj(x)) if self.gate_up_proj is None
                        else self.gate_up_proj(x).chunk(2, dim=-1))
            return self.down_proj(kernels.activation_and_mul(gate, up, self.act))
        if self.gate_up_proj is None:
            return self.down_proj(kernels.silu_and_mul(self.gate_proj(x), self.up_proj(x)))
        if not isinstance(self.gate_up_proj, nn.Linear):  # FP8 (ops.fp8.Fp8Linear): its own product
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            if isinstance(self.down_proj, Fp8Linear) and self.down_proj.takes_tokens(gate):
                return self.down_proj(kernels.silu_and_mul_fp8(gate, up))  # quantized in SiLU·mul's kernel
            return self.down_proj(kernels.silu_and_mul(gate, up))
        # SiLU·mul in the GEMM's epilogue for decode batches where that was measured faster
        return self.down_proj(kernels.gated_linear(x, self.gate_up_proj.weight, self.gate_up_proj.bias))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, arch: ModelArch, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(arch, layer_idx)
        self.mlp = LlamaMLP(arch)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.norm_eps)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.norm_eps)

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
                kv_cache: torch.Tensor, attn: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous sublayer's output, still to be added to `residual` (None for the first
        layer, whose x is the embedding). Returns this layer's MLP output and the residual stream:
        each add happens inside the next norm (the same sums as x + f(norm(x)), fewer launches)."""
        # quantize=True only where _hands_tokens allows it: a plain RMSNorm (tensor parallelism's
        # reducing norms take no such argument)
        if _hands_tokens(self.input_layernorm, getattr(self.self_attn, "qkv_proj", None), x):
            h, residual = (self.input_layernorm.add_forward(x, residual, quantize=True) if residual is not None
                           else (self.input_layernorm(x, quantize=True), x))
        elif residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm.add_forward(x, residual)
        out = self.self_attn(h, cos, sin, kv_cache, attn)
        if _hands_tokens(self.post_attention_layernorm,
                         self.mlp.gate_up_proj if isinstance(self.mlp, LlamaMLP) else None, out):
            h, residual = self.post_attention_layernorm.add_forward(out, residual, quantize=True)
        else:
            h, residual = self.post_attention_layernorm.add_forward(out, residual)
        return self.mlp(h), residual


def _hands_tokens(norm: nn.Module, projection: Optional[nn.Module], x: torch.Tensor) -> bool:
    """Whether `norm` hands `projection` its output quantized per token: a stacked fp8 projection
    whose decode kernel for this many rows takes quantized tokens, after a plain RMSNorm (tensor
    parallelism's reducing norms keep their own add_forward)."""
    return type(norm) is RMSNorm and isinstance(projection, Fp8Linear) and projection.takes_tokens(x)


class LlamaModel(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(arch, i) for i in range(arch.num_hidden_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.norm_eps)
        # None for ALiBi (Baichuan 13B): its attention modules add the bias, cos/sin are None.
        self.rotary_emb = RotaryEmbedding(arch) if arch.position_encoding == "rope" else None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn: AttentionMetadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(positions) if self.rotary_emb is not None else (None, None)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, cos, sin, kv_cache, attn)
        return self.norm.add_forward(x, residual)[0] if residual is not None else self.norm(x)


class LlamaForCausalLM(nn.Module):
    """The Llama family; implements models.interface.CausalLM. Parameter names and layouts are
    HF's, so checkpoint tensors load as they are."""

    model_class: type[nn.Module] = LlamaModel
    """The decoder stack (`model.`): families of this layout with other blocks override it."""

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.arch = arch
        self.model = self.model_class(arch)
        self.lm_head = Linear(arch.hidden_size, arch.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the embedding with lm_head when the config says so (call again after to_empty)."""
        if self.arch.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def reset_buffers(self) -> None:
        """Recompute non-persistent buffers (after building on the meta device and to_empty)."""
        if self.model.rotary_emb is not None:
            self.model.rotary_emb.reset_buffers()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, attn)

    def fuse_projections(self) -> None:
        """Stack q/k/v and gate/up into single GEMMs (fewer, larger kernels: worth it on GPU).

        The state dict keeps HF names: hooks split the stacks on save and stack them on load, so
        checkpoints, HF twins and weight copies between engines work unchanged.
        """
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            hands = isinstance(layer, LlamaDecoderLayer)  # its norms hand fp8 projections tokens (Gemma's do not)
            attn.qkv_proj = _stack(attn.q_proj, attn.k_proj, attn.v_proj)
            del attn.q_proj, attn.k_proj, attn.v_proj
            if hands:
                _mark_norm_fed(attn.qkv_proj, layer.input_layernorm)
            if not isinstance(mlp, LlamaMLP):  # an MoE block (models/moe.py) keeps its experts stacked
                continue
            mlp.gate_up_proj = _stack(mlp.gate_proj, mlp.up_proj)
            del mlp.gate_proj, mlp.up_proj
            if hands:
                _mark_norm_fed(mlp.gate_up_proj, layer.post_attention_layernorm)
            if mlp.act in ("silu", "swish") and isinstance(mlp.gate_up_proj, Fp8Linear) and \
                    isinstance(mlp.down_proj, Fp8Linear):
                mlp.down_proj.producer = "silu_mul"  # SiLU·mul's kernel can quantize its input
        self._register_state_dict_hook(_split_fused)
        self._register_load_state_dict_pre_hook(_stack_fused)

    def checkpoint_tensors(self, name: str, tensor: Any) -> Iterator[tuple[str, Any]]:
        yield name, tensor  # HF names and layouts; lazy slices stay lazy (TP reads only its slice)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        return self.state_dict()  # already HF names, also after fuse_projections (its hooks)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, vocab] in float32 for the rows of `hidden` that are sampled."""
        return self.lm_head(hidden).float()

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        # The attention modules' head count, not arch's: tensor parallelism shards it per rank.
        attn = self.model.layers[0].self_attn
        return (2, num_blocks, block_size, attn.num_kv_heads, attn.head_dim)


_FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


def _mark_norm_fed(projection: nn.Module, norm: nn.Module) -> None:
    """An fp8 projection after a plain RMSNorm may get its input quantized by the norm
    (_hands_tokens): select_configs then times its candidates after the norm (Fp8Linear.producer)."""
    if isinstance(projection, Fp8Linear) and type(norm) is RMSNorm:
        projection.producer = "rms_norm"


def _stack(*linears: nn.Module) -> nn.Module:
    first = linears[0]
    if isinstance(first, Fp8Linear):
        return stack_fp8(list(linears))
    out = sum(lin.out_features for lin in linears)
    fused = Linear(first.in_features, out, bias=first.bias is not None,
                      device=first.weight.device, dtype=first.weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([lin.weight for lin in linears]))
        if first.bias is not None:
            fused.bias.copy_(torch.cat([lin.bias for lin in linears]))
    return fused


def _split_fused(module: nn.Module, state_dict: dict, prefix: str, local_metadata) -> None:
    """state_dict hook: present stacked projections under their HF names."""
    for layer_idx, layer in enumerate(module.model.layers):
        base = f"{prefix}model.layers.{layer_idx}."
        for fused, parts in _FUSED.items():
            if fused.startswith("mlp") and not isinstance(layer.mlp, LlamaMLP):
                continue
            sizes = layer.self_attn.sizes if fused.startswith("self_attn") else [layer.mlp.down_proj.in_features] * 2
            for kind in ("weight", "bias"):
                tensor = state_dict.pop(f"{base}{fused}.{kind}", None)
                if tensor is not None:
                    for name, chunk in zip(parts, tensor.split(list(sizes))):
                        state_dict[f"{base}{name}.{kind}"] = chunk


def _stack_fused(state_dict: dict, prefix: str, *args) -> None:
    """load_state_dict pre-hook: accept HF names for stacked projections."""
    for key in [k for k in state_dict if k.endswith("self_attn.q_proj.weight") or k.endswith("self_attn.q_proj.bias")
                or k.endswith("mlp.gate_proj.weight") or k.endswith("mlp.gate_proj.bias")]:
        kind = key.rsplit(".", 1)[1]
        for fused, parts in _FUSED.items():
            if key.endswith(f"{parts[0]}.{kind}"):
                base = key[: -len(f"{parts[0]}.{kind}")]
                state_dict[f"{base}{fused}.{kind}"] = torch.cat([state_dict.pop(f"{base}{p}.{kind}") for p in parts])
