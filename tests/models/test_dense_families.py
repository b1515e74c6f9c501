"""Baichuan / Baichuan2, Gemma 2, Gemma 3 text and Phi-3 against float32 HF references, through the
whole engine (block size 4, a 16-token budget that splits the longer prompts into prefill chunks,
prefix caching with a second round sharing prefixes, all requests batched): every greedy token
equals the reference's, every logprob is within LOGPROB_ATOL (test_families.py reasons it).

- Gemma 2, Gemma 3 and Phi-3: HF's own classes built from our tiny presets with random weights,
  saved with save_pretrained (Phi-3's fused qkv_proj / gate_up_proj as HF writes them), loaded
  by our loader.
- Baichuan has no transformers class and its remote code is never run. The checkpoints here are
  written by hand in its layout (config.json as the Hub ships it, safetensors with W_pack and the
  raw, unnormalized NormHead). The 7B reference is HF's LlamaForCausalLM holding the same
  weights remapped (W_pack split into q/k/v, lm_head rows L2-normalized as NormHead does). The
  13B reference is the same Llama with rotary made the identity and an eager attention that adds
  ALiBi's bias built by HF Bloom's build_alibi_tensor (the Bloom path).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tritongen import LLM, SamplingParams
from tritongen.models.arch import ModelArch
from tritongen.models.hf_twin import hf_greedy
from tritongen.models.loader import load_model, read_arch
from tritongen.models.presets import PRESETS
from tritongen.parallel.tensor_parallel import validate_tensor_parallel

transformers = pytest.importorskip("transformers")
from family_checks import LOGPROB_ATOL, MAX_TOKENS, check_engine, check_openai_chat, hf_config, random_prompts  # noqa: E402

DENSE_PRESETS = ("tiny-baichuan", "tiny-baichuan-13b", "tiny-gemma2", "tiny-gemma3", "tiny-phi3")
HF_FAMILIES = {"Gemma2ForCausalLM": "tiny-gemma2", "Gemma3ForCausalLM": "tiny-gemma3", "Phi3ForCausalLM": "tiny-phi3"}


@torch.no_grad()
def _randomize(model: torch.nn.Module, seed: int, norm_center: float = 1.0) -> None:
    """Norm weights ~ N(norm_center, 0.1) (Gemma's are offsets from 1: center 0), matrices
    ~ N(0, 1/hidden): logits spread out, so no near-tie flips a greedy token."""
    gen = torch.Generator().manual_seed(seed)
    hidden = model.config.hidden_size
    for _, p in model.named_parameters():
        if p.dim() == 1:
            p.copy_(norm_center + 0.1 * torch.randn(p.shape, generator=gen))
        else:
            p.copy_(torch.randn(p.shape, generator=gen) * hidden ** -0.5)


@pytest.fixture(scope="module", params=list(HF_FAMILIES))
def family(request, tmp_path_factory) -> tuple[str, Path, torch.nn.Module]:
    arch_name = request.param
    hf = transformers.AutoModelForCausalLM.from_config(hf_config(HF_FAMILIES[arch_name]), dtype=torch.float32,
                                                       attn_implementation="eager")
    assert type(hf).__name__ == arch_name
    _randomize(hf, seed=1, norm_center=0.0 if arch_name.startswith("Gemma") else 1.0)
    path = tmp_path_factory.mktemp(arch_name)
    hf.save_pretrained(path)
    return arch_name, path, hf.eval()


def test_engine_greedy_and_logprobs_match_hf(family, default_model_dir) -> None:
    arch_name, path, hf = family
    check_engine(path, default_model_dir, lambda p: hf_greedy(hf, p, MAX_TOKENS), hf.config.vocab_size, arch_name)


def test_hf_config_parses_to_the_preset_arch(family) -> None:
    """HF's saved config.json (transformers 5.x layout: Gemma 3's per-layer-type rope_parameters,
    Phi-3's longrope) parses to what the preset (the Hub's layout) parses to."""
    arch_name, path, hf = family
    ours = read_arch(f"dummy:{HF_FAMILIES[arch_name]}")
    theirs = read_arch(str(path))
    assert {**theirs.__dict__, "torch_dtype": None} == {**ours.__dict__, "torch_dtype": None}
    assert ModelArch.from_hf_config(ours.to_hf_config()) == ours
    net, _ = load_model(str(path), torch.float32, torch.device("cpu"))
    hf_state = hf.state_dict()
    mine = net.hf_state_dict()
    assert set(mine) == set(hf_state) - {"lm_head.weight"} or set(mine) == set(hf_state)
    assert all(torch.equal(t, hf_state[name]) for name, t in mine.items())  # Phi-3's fused names too


def test_gemma_arch_facts() -> None:
    g2, g3 = read_arch("dummy:gemma-2-9b"), read_arch("dummy:tiny-gemma3")
    assert [g2.layer_sliding_window(i) for i in range(4)] == [4096, None, 4096, None]
    assert (g2.attn_logit_softcapping, g2.final_logit_softcapping, g2.attention_scale) == (50.0, 30.0, 256 ** -0.5)
    assert g2.tie_word_embeddings and g2.embedding_multiplier == 3584 ** 0.5 and g2.norm_weight_offset == 1.0
    assert g3.qk_norm and (g3.rope_theta, g3.rope_local_theta) == (1e6, 1e4)
    assert g3.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert g3.final_logit_softcapping is None and g3.attn_logit_softcapping is None


def test_phi3_long_prompt_uses_long_factors_per_sequence(default_model_dir, tmp_path) -> None:
    """A 70-token prompt crosses tiny-phi3's original_max_position_embeddings (64): HF rotates it
    with long_factor; a 9-token prompt batched beside it keeps short_factor (per sequence)."""
    hf = transformers.AutoModelForCausalLM.from_config(hf_config("tiny-phi3"), dtype=torch.float32,
                                                       attn_implementation="eager")
    _randomize(hf, seed=7)
    hf.save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), tokenizer=default_model_dir, dtype="float32", device="cpu", block_size=4,
              max_num_batched_tokens=128)
    prompts = random_prompts(hf.config.vocab_size, seed=8, lengths=(70, 9))
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    for prompt, out in zip(prompts, llm.generate(prompts, params)):
        ids, lps = hf_greedy(hf.eval(), prompt, MAX_TOKENS)
        assert out.token_ids == ids, len(prompt)
        torch.testing.assert_close(torch.tensor([lp.logprob for lp in out.logprobs]), torch.tensor(lps),
                                   atol=LOGPROB_ATOL, rtol=0)
    arch = read_arch("dummy:tiny-phi3")
    assert arch.rope_scaling["attention_factor"] == pytest.approx((1 + torch.log(torch.tensor(4.0)).item()
                                                                   / torch.log(torch.tensor(64.0)).item()) ** 0.5)


def test_phi3_long_tokens_follow_each_rows_sequence_from_device_metadata() -> None:
    """LongRoPE's per-row choice reads only device tensors (a mixed step's CUDA graph replays other
    batches): rows of a sequence past original_max_position_embeddings (64) rotate long, the rest
    short, with empty sequence slots between them and padding rows after them."""
    from tritongen.models.phi3 import LongRoPE
    from tritongen.ops.attention import AttentionMetadata

    rope = LongRoPE(read_arch("dummy:tiny-phi3"))
    qsl, lens = [0, 3, 3, 8, 9, 9], [100, 0, 5, 65, 0]  # 3 rows of a long one, an empty slot, 5 short, 1 long
    meta = AttentionMetadata(slot_mapping=torch.zeros(12, dtype=torch.int64),
                             query_start_loc=torch.tensor(qsl, dtype=torch.int32),
                             seq_lens=torch.tensor(lens, dtype=torch.int32),
                             block_tables=torch.zeros(5, 1, dtype=torch.int32),
                             query_start_loc_cpu=[0, 12, 12, 12, 12, 12], seq_lens_cpu=[12, 0, 0, 0, 0], block_size=4)
    got = rope.long_tokens(torch.arange(12), meta)
    assert got[:9].tolist() == [True] * 3 + [False] * 5 + [True]


# -- Baichuan: hand-written checkpoints, HF Llama references --------------------------------------

class _IdentityRotary(torch.nn.Module):
    """cos = 1, sin = 0: HF's rotary leaves q and k exactly as they are (ALiBi has none)."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (*position_ids.shape, self.head_dim)
        return torch.ones(shape, dtype=x.dtype, device=x.device), torch.zeros(shape, dtype=x.dtype, device=x.device)


def _alibi_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager causal attention plus ALiBi as HF Bloom builds it (a slope per head times the key
    position); one unpadded sequence, as hf_greedy runs."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    heads, q_len, k_len = query.shape[1], query.shape[2], key.shape[2]
    bias = build_alibi_tensor(torch.ones(1, k_len), heads, torch.float32).view(1, heads, 1, k_len).to(query.device)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling + bias
    causal = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril(k_len - q_len)
    probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1, dtype=torch.float32)
    return torch.matmul(probs.to(query.dtype), value).transpose(1, 2).contiguous(), probs


def _baichuan(preset: str, path: Path, seed: int) -> torch.nn.Module:
    """Write a Baichuan checkpoint of `preset` into `path`; return its float32 Llama reference."""
    from safetensors.torch import save_file

    a = read_arch(f"dummy:{preset}")
    alibi = a.position_encoding == "alibi"
    config = transformers.LlamaConfig(
        vocab_size=a.vocab_size, hidden_size=a.hidden_size, intermediate_size=a.intermediate_size,
        num_hidden_layers=a.num_hidden_layers, num_attention_heads=a.num_attention_heads,
        num_key_value_heads=a.num_attention_heads, rms_norm_eps=a.norm_eps, rope_theta=10000.0,
        max_position_embeddings=a.max_position_embeddings, tie_word_embeddings=False)
    if alibi and "baichuan_alibi" not in transformers.AttentionInterface._global_mapping:
        transformers.AttentionInterface.register("baichuan_alibi", _alibi_attention)
        transformers.AttentionMaskInterface.register(
            "baichuan_alibi", transformers.masking_utils.ALL_MASK_ATTENTION_FUNCTIONS["eager"])
    ref = transformers.LlamaForCausalLM._from_config(
        config, dtype=torch.float32, attn_implementation="baichuan_alibi" if alibi else "eager")
    _randomize(ref, seed)
    if alibi:
        ref.model.rotary_emb = _IdentityRotary(a.head_dim)
    state = {}
    for name, t in ref.state_dict().items():
        if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            continue
        if ".self_attn.q_proj." in name:
            state[name.replace("q_proj", "W_pack")] = torch.cat(
                [ref.state_dict()[name.replace("q_proj", p)] for p in ("q_proj", "k_proj", "v_proj")])
        else:
            state[name] = t.contiguous()
    state["lm_head.weight"] = state["lm_head.weight"] * 3.0  # NormHead rows are not unit in checkpoints
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(PRESETS[preset]))
    with torch.no_grad():
        ref.lm_head.weight.copy_(F.normalize(state["lm_head.weight"], dim=-1))
    return ref.eval()


@pytest.mark.parametrize("preset", ["tiny-baichuan", "tiny-baichuan-13b"])
def test_baichuan_engine_matches_llama_reference(preset: str, default_model_dir, tmp_path) -> None:
    ref = _baichuan(preset, tmp_path, seed=11)
    check_engine(tmp_path, default_model_dir, lambda p: hf_greedy(ref, p, MAX_TOKENS), ref.config.vocab_size,
                  "BaichuanForCausalLM")


def test_baichuan_checkpoint_layout_loads(tmp_path) -> None:
    from safetensors.torch import load_file

    ref = _baichuan("tiny-baichuan-13b", tmp_path, seed=12)
    net, arch = load_model(str(tmp_path), torch.float32, torch.device("cpu"))
    assert arch.position_encoding == "alibi" and arch.normalized_lm_head and net.model.rotary_emb is None
    saved = load_file(str(tmp_path / "model.safetensors"))
    for i in range(arch.num_hidden_layers):
        attn = net.model.layers[i].self_attn
        packed = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        assert torch.equal(packed, saved[f"model.layers.{i}.self_attn.W_pack.weight"])
    assert torch.equal(net.lm_head.weight, F.normalize(saved["lm_head.weight"], dim=-1))
    assert torch.allclose(net.lm_head.weight.norm(dim=-1), torch.ones(arch.vocab_size))
    assert all(torch.equal(t, ref.state_dict()[n]) for n, t in net.hf_state_dict().items())
    half, _ = load_model("dummy:tiny-baichuan-13b", torch.bfloat16, torch.device("cpu"))
    assert half.model.layers[0].self_attn.alibi_slopes.dtype == torch.float32


def test_baichuan_variants_from_hub_configs() -> None:
    """The 7B (max_position_embeddings) rotates, the 13B (model_max_length only) uses ALiBi;
    Baichuan2's vocabulary or z_loss_weight marks the NormHead, Baichuan 1's 64000 plain head."""
    b7, b13 = read_arch("dummy:baichuan2-7b"), read_arch("dummy:baichuan2-13b")
    assert (b7.position_encoding, b7.rope_theta, b7.num_key_value_heads) == ("rope", 10000.0, 32)
    assert (b13.position_encoding, b13.rope_theta, b13.max_position_embeddings) == ("alibi", None, 4096)
    assert b7.normalized_lm_head and b13.normalized_lm_head
    v1 = {k: v for k, v in PRESETS["baichuan2-13b"].items()}
    v1["vocab_size"] = 64000
    assert not ModelArch.from_hf_config(v1).normalized_lm_head


# -- refusals ---------------------------------------------------------------------------------------

def test_tensor_parallel_accepts_the_tiny_dense_families() -> None:
    for preset in ("tiny-baichuan", "tiny-baichuan-13b", "tiny-gemma2", "tiny-gemma3", "tiny-phi3"):
        validate_tensor_parallel(read_arch(f"dummy:{preset}"), 2)  # TP=2 parity: tests/parallel/test_tp_families.py


@pytest.mark.parametrize("preset, change, message", [
    ("tiny-gemma2", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ("tiny-gemma2", {"hidden_activation": "relu"}, "unsupported Gemma hidden_activation 'relu'"),
    ("tiny-gemma3", {"layer_types": ["sliding_attention"]}, "layer_types must name"),
    ("tiny-phi3", {"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "unsupported Phi-3 rope type 'dynamic'"),
    ("tiny-phi3", {"rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}},
     "short_factor as a list of 8 numbers"),
    ("tiny-phi3", {"partial_rotary_factor": 0.75}, "partial_rotary_factor"),
    ("tiny-baichuan", {"num_key_value_heads": 2}, "num_key_value_heads"),
    ("tiny-baichuan", {"hidden_act": "gelu"}, "unsupported hidden_act 'gelu'"),
])
def test_unsupported_options_are_refused_by_name(preset: str, change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelArch.from_hf_config({**PRESETS[preset], **change})


@pytest.mark.parametrize("preset", ["tiny-gemma2", "tiny-gemma3", "tiny-phi3"])
def test_hf_twin_holds_our_weights(preset: str) -> None:
    """eval parity and the GPU suite build HF twins of dummy models: HF's class, our exact tensors."""
    from tritongen.models.hf_twin import hf_twin

    net, arch = load_model(f"dummy:{preset}", torch.float32, torch.device("cpu"))
    twin = hf_twin(net, arch)
    assert type(twin).__name__ == arch.architecture
    theirs = twin.state_dict()
    assert all(torch.equal(t, theirs[name]) for name, t in net.hf_state_dict().items())


def test_hf_twin_of_baichuan_7b_is_llama_and_13b_is_refused(tmp_path) -> None:
    """eval parity's twin of a Baichuan 7B checkpoint is HF Llama with the remapped weights (the
    reference above); the ALiBi 13B has no transformers class and is refused by name."""
    from tritongen.models.hf_twin import hf_twin

    ref = _baichuan("tiny-baichuan", tmp_path, seed=13)
    net, arch = load_model(str(tmp_path), torch.float32, torch.device("cpu"))
    twin = hf_twin(net, arch)
    assert type(twin).__name__ == "LlamaForCausalLM"
    assert all(torch.equal(t, ref.state_dict()[n]) for n, t in twin.state_dict().items())
    net13, arch13 = load_model("dummy:tiny-baichuan-13b", torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="no HF transformers class computes Baichuan's ALiBi"):
        hf_twin(net13, arch13)


@pytest.mark.parametrize("preset", DENSE_PRESETS)
def test_openai_server_chat_smoke(preset: str, default_model_dir) -> None:
    """Each family behind the real OpenAI server: chat through the tokenizer's template, greedy."""
    check_openai_chat(preset, default_model_dir)


@pytest.mark.parametrize("preset", DENSE_PRESETS)
def test_fuse_projections_keeps_outputs_and_checkpoint_names(preset: str) -> None:
    """What the GPU runner does at load (stack q/k/v and gate/up): the same hidden states (GeGLU
    splits the stacked gate/up itself), and hf_state_dict still gives the checkpoint's names."""
    from tritongen.ops.attention import build_attention_metadata

    plain, arch = load_model(f"dummy:{preset}", torch.float32, torch.device("cpu"))
    fused, _ = load_model(f"dummy:{preset}", torch.float32, torch.device("cpu"))
    fused.fuse_projections()
    assert fused.model.layers[0].self_attn.qkv_proj is not None and fused.model.layers[0].mlp.gate_up_proj is not None
    want, got = plain.hf_state_dict(), fused.hf_state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], v) for k, v in want.items())
    ids, pos = torch.tensor([5, 6, 7, 8, 9, 10]), torch.arange(6)
    meta = build_attention_metadata([6], [6], [[1, 0]], 4)

    def kv():
        return [torch.zeros(2, 2, 4, arch.num_key_value_heads, arch.head_dim) for _ in range(arch.num_hidden_layers)]

    with torch.no_grad():
        torch.testing.assert_close(fused(ids, pos, kv(), meta), plain(ids, pos, kv(), meta), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("preset", DENSE_PRESETS)
def test_cuda_engine_matches_reference(preset: str, default_model_dir, tmp_path) -> None:
    """On CUDA (Triton attention kernels with ALiBi / softcap / per-layer windows, fused
    projections, decode CUDA graphs) against the same float32 references on CUDA."""
    arch_name = PRESETS[preset]["architectures"][0]
    if arch_name == "BaichuanForCausalLM":
        ref = _baichuan(preset, tmp_path, seed=11)
    else:
        ref = transformers.AutoModelForCausalLM.from_config(hf_config(preset), dtype=torch.float32,
                                                            attn_implementation="eager")
        _randomize(ref, seed=1, norm_center=0.0 if arch_name.startswith("Gemma") else 1.0)
        ref.save_pretrained(tmp_path)
    ref = ref.cuda().eval()
    llm = LLM(str(tmp_path), tokenizer=default_model_dir, dtype="float32", device="cuda", block_size=16,
              max_num_batched_tokens=32, num_blocks=256)
    lengths = (1, 9, 41, 70) if preset != "tiny-phi3" else (1, 9, 41)  # 70 crosses LongRoPE's boundary chunked
    prompts = random_prompts(ref.config.vocab_size, seed=6, lengths=lengths)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    try:
        for prompt, out in zip(prompts, llm.generate(prompts, params)):
            ids, lps = hf_greedy(ref, prompt, MAX_TOKENS)
            assert out.token_ids == ids, (preset, len(prompt))
            torch.testing.assert_close(torch.tensor([lp.logprob for lp in out.logprobs]), torch.tensor(lps),
                                       atol=LOGPROB_ATOL, rtol=0)
    finally:
        llm.shutdown()
