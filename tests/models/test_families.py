"""New families against HF transformers' own classes, float32 on CPU, through the whole engine.

Each family's HF class is built from our tiny preset's config with random weights, saved with
save_pretrained and loaded by our loader from that directory (HF's own config.json and tensor
names and layouts: GPT-2's Conv1D and fused c_attn included). The engine then runs with a small
block size, a token budget that splits the longer prompts into chunks, prefix caching on (a second
round shares prefixes with the first) and all requests batched together; every greedy token must
equal HF generate's and every logprob must be within LOGPROB_ATOL.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from tritongen import LLM
from tritongen.models.arch import SUPPORTED_ARCHITECTURES, ModelArch
from tritongen.models.hf_twin import hf_greedy
from tritongen.models.interface import CausalLM
from tritongen.models.loader import build_empty_model, load_model, read_arch
from tritongen.models.presets import PRESETS
from tritongen.models.registry import get_model_class
from tritongen.parallel.tensor_parallel import validate_tensor_parallel

transformers = pytest.importorskip("transformers")
from family_checks import MAX_TOKENS, check_batch, check_engine, check_openai_chat, hf_config, random_prompts  # noqa: E402

FAMILIES = {"Qwen3ForCausalLM": "tiny-qwen3", "GPT2LMHeadModel": "tiny-gpt2", "BloomForCausalLM": "tiny-bloom"}


@torch.no_grad()
def _randomize(hf: torch.nn.Module, seed: int) -> None:
    """Weights large enough that the logits spread out (HF's init, std 0.02, leaves near-ties that
    rounding could flip): norm scales ~ N(1, 0.1), biases ~ N(0, 0.1), matrices ~ N(0, 1/hidden)."""
    gen = torch.Generator().manual_seed(seed)
    hidden = hf.config.hidden_size
    for name, p in hf.named_parameters():
        if p.dim() == 1 and name.endswith("weight"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif p.dim() == 1:
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        else:
            p.copy_(torch.randn(p.shape, generator=gen) * hidden ** -0.5)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory) -> tuple[str, Path, torch.nn.Module]:
    """(architecture, HF directory saved by HF, the HF model) of one family."""
    arch_name = request.param
    hf = transformers.AutoModelForCausalLM.from_config(hf_config(FAMILIES[arch_name]), dtype=torch.float32,
                                                       attn_implementation="eager")
    assert type(hf).__name__ == arch_name
    _randomize(hf, seed=1)
    path = tmp_path_factory.mktemp(arch_name)
    hf.save_pretrained(path)
    return arch_name, path, hf.eval()


def test_engine_greedy_and_logprobs_match_hf(family, default_model_dir) -> None:
    arch_name, path, hf = family
    check_engine(path, default_model_dir, lambda prompt: hf_greedy(hf, prompt, MAX_TOKENS), hf.config.vocab_size,
                 arch_name)


def test_hf_config_parses_to_the_preset_arch(family) -> None:
    arch_name, path, _ = family
    ours = read_arch(f"dummy:{FAMILIES[arch_name]}")
    theirs = read_arch(str(path))  # HF's config.json, transformers 5.x layout
    assert {**theirs.__dict__, "torch_dtype": None} == {**ours.__dict__, "torch_dtype": None}
    assert ModelArch.from_hf_config(ours.to_hf_config()) == ours


def test_every_registered_class_implements_the_interface() -> None:
    for name in SUPPORTED_ARCHITECTURES:
        preset = next(p for p, d in PRESETS.items() if d["architectures"][0] == name)
        net = build_empty_model(read_arch(f"dummy:{preset}"), torch.float32, torch.device("cpu"))
        assert isinstance(net, get_model_class(name)) and isinstance(net, CausalLM), name


def test_gpt2_hub_layout_checkpoint_loads(tmp_path: Path) -> None:
    """The Hub's gpt2 was saved from GPT2Model: no "transformer." prefix, no lm_head (tied), and
    the causal-mask buffers attn.bias / attn.masked_bias; a .bin file of that layout loads."""
    hf = transformers.AutoModelForCausalLM.from_config(hf_config("tiny-gpt2"), dtype=torch.float32)
    _randomize(hf, seed=4)
    state = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    for i in range(hf.config.n_layer):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(8, 8, dtype=torch.bool))
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps(PRESETS["tiny-gpt2"]))
    net, arch = load_model(str(tmp_path), torch.float32, torch.device("cpu"))
    assert net.lm_head.weight is net.transformer.wte.weight
    assert torch.equal(net.transformer.h[0].attn.k_proj.weight,
                       hf.transformer.h[0].attn.c_attn.weight[:, 64:128].t())
    hf_state = hf.state_dict()
    for name, tensor in net.hf_state_dict().items():  # the round trip back to HF's layout
        assert torch.equal(tensor, hf_state[name]), name


def test_tensor_parallel_accepts_gpt2_and_bloom() -> None:
    for preset in ("tiny-gpt2", "tiny-bloom"):  # TP=2 parity: tests/parallel/test_tp_families.py
        validate_tensor_parallel(read_arch(f"dummy:{preset}"), 2)
    validate_tensor_parallel(read_arch("dummy:tiny-qwen3"), 2)  # Llama family: sharded (tests/parallel)


def test_bloom_hub_layout_checkpoint_loads_and_slopes_stay_float32(tmp_path: Path) -> None:
    """The Hub's Bloom checkpoints lack the "transformer." prefix and lm_head (tied)."""
    from safetensors.torch import save_file

    hf = transformers.AutoModelForCausalLM.from_config(hf_config("tiny-bloom"), dtype=torch.float32)
    _randomize(hf, seed=5)
    state = {k.removeprefix("transformer."): v.contiguous() for k, v in hf.state_dict().items()
             if k != "lm_head.weight"}
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(PRESETS["tiny-bloom"]))
    net, _ = load_model(str(tmp_path), torch.float32, torch.device("cpu"))
    assert net.lm_head.weight is net.transformer.word_embeddings.weight
    hf_state = hf.state_dict()
    assert all(torch.equal(t, hf_state[name]) for name, t in net.hf_state_dict().items())
    half, _ = load_model("dummy:tiny-bloom", torch.bfloat16, torch.device("cpu"))
    assert half.transformer.alibi_slopes.dtype == torch.float32
    expected = transformers.models.bloom.modeling_bloom.build_alibi_tensor(torch.ones(1, 3), 6, torch.float32)
    assert torch.equal(half.transformer.alibi_slopes, expected[:, 0, 1])  # key position 1: the slopes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_engine_matches_hf(family, default_model_dir) -> None:
    """On CUDA (Triton kernels, fused projections, decode CUDA graphs) against HF on CUDA, both in
    float32; Bloom's ALiBi runs inside the Triton attention kernels."""
    arch_name, path, hf_cpu = family
    hf = copy.deepcopy(hf_cpu).cuda()
    kw = dict(tokenizer=default_model_dir, dtype="float32", device="cuda", block_size=16,
              max_num_batched_tokens=32, num_blocks=256)
    llm = LLM(str(path), **kw)
    prompts = random_prompts(hf.config.vocab_size, seed=6, lengths=(1, 9, 41, 70))
    try:
        check_batch(llm, prompts, lambda prompt: hf_greedy(hf, prompt, MAX_TOKENS), arch_name)
    finally:
        llm.shutdown()


@pytest.mark.parametrize("preset, change, message", [
    ("tiny-gpt2", {"activation_function": "relu"}, "unsupported GPT-2 activation_function 'relu'"),
    ("tiny-gpt2", {"scale_attn_by_inverse_layer_idx": True}, "unsupported GPT-2 attention scaling"),
    ("tiny-gpt2", {"add_cross_attention": True}, "add_cross_attention"),
    ("tiny-bloom", {"apply_residual_connection_post_layernorm": True}, "apply_residual_connection_post_layernorm"),
    ("tiny-qwen3", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
])
def test_unsupported_options_are_refused_by_name(preset: str, change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelArch.from_hf_config({**PRESETS[preset], **change})


@pytest.mark.parametrize("preset", list(FAMILIES.values()))
def test_openai_server_chat_smoke(preset: str, default_model_dir) -> None:
    """Qwen3, GPT-2 and Bloom behind the real OpenAI server: a greedy chat through the tokenizer's template."""
    check_openai_chat(preset, default_model_dir)
