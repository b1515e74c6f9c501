"""Mixtral and Qwen3-MoE against HF transformers' own classes, float32, through the whole engine.

As in test_families.py: HF's class built from our tiny preset's config with random weights, saved
with save_pretrained (which writes the Hub's per-expert tensors: block_sparse_moe.experts.E.w1/w2/w3
for Mixtral, mlp.experts.E.gate_proj/up_proj/down_proj for Qwen3-MoE) and loaded by our loader;
the engine runs with block size 4, a 16-token budget (chunked prefill), prefix caching and all
requests batched. A second directory holds the same weights in transformers 5.x's fused in-memory
layout (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]); both must load to HF's
exact tensors. tiny-qwen3-moe routes top-3 of 8 without renormalization and keeps layer 1 dense
(mlp_only_layers); tiny-mixtral routes top-2 of 4, renormalized.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from tritongen import LLM, SamplingParams
from tritongen.models.arch import ModelArch
from tritongen.models.hf_twin import hf_greedy, hf_twin
from tritongen.models.loader import load_model, read_arch
from tritongen.models.moe import SparseMoeBlock
from tritongen.models.presets import PRESETS
from tritongen.ops import moe
from tritongen.parallel.tensor_parallel import validate_tensor_parallel

transformers = pytest.importorskip("transformers")
from family_checks import MAX_TOKENS, check_batch, check_engine, check_openai_chat, hf_config, random_prompts  # noqa: E402

FAMILIES = {"MixtralForCausalLM": "tiny-mixtral", "Qwen3MoeForCausalLM": "tiny-qwen3-moe"}


@torch.no_grad()
def _randomize(hf: torch.nn.Module, seed: int) -> None:
    """Norm scales ~ N(1, 0.1), matrices (router and experts too) ~ N(0, 1/hidden)."""
    gen = torch.Generator().manual_seed(seed)
    hidden = hf.config.hidden_size
    for name, p in hf.named_parameters():
        if p.dim() == 1:
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        else:
            p.copy_(torch.randn(p.shape, generator=gen) * hidden ** -0.5)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory) -> tuple[str, Path, Path, torch.nn.Module]:
    """(architecture, HF's save_pretrained directory, a fused-layout directory, the HF model)."""
    from safetensors.torch import save_file

    arch_name = request.param
    hf = transformers.AutoModelForCausalLM.from_config(hf_config(FAMILIES[arch_name]), dtype=torch.float32,
                                                       attn_implementation="eager")
    assert type(hf).__name__ == arch_name
    _randomize(hf, seed=1)
    saved = tmp_path_factory.mktemp(arch_name)
    hf.save_pretrained(saved)
    fused = tmp_path_factory.mktemp(arch_name + "-fused")
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(fused / "model.safetensors"))
    (fused / "config.json").write_text((saved / "config.json").read_text())
    return arch_name, saved, fused, hf.eval()


def _saved_names(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return list(f.keys())


def test_save_pretrained_writes_the_hub_per_expert_layout(family) -> None:
    arch_name, saved, _, _ = family
    names = _saved_names(saved)
    expert = ("model.layers.0.block_sparse_moe.experts.3.w2.weight" if arch_name == "MixtralForCausalLM"
              else "model.layers.0.mlp.experts.7.up_proj.weight")
    assert expert in names
    assert not any("gate_up_proj" in n for n in names)


def test_both_checkpoint_layouts_load_hf_exact_weights(family) -> None:
    _, saved, fused, hf = family
    hf_state = hf.state_dict()
    for path in (saved, fused):
        net, _ = load_model(str(path), torch.float32, torch.device("cpu"))
        ours = net.hf_state_dict()
        assert set(ours) == set(hf_state)
        for name, tensor in ours.items():
            assert torch.equal(tensor, hf_state[name]), (path.name, name)


def test_engine_greedy_and_logprobs_match_hf(family, default_model_dir) -> None:
    arch_name, saved, _, hf = family
    check_engine(saved, default_model_dir, lambda prompt: hf_greedy(hf, prompt, MAX_TOKENS), hf.config.vocab_size,
                 arch_name)


def test_hf_config_parses_to_the_preset_arch(family) -> None:
    arch_name, saved, _, _ = family
    ours = read_arch(f"dummy:{FAMILIES[arch_name]}")
    theirs = read_arch(str(saved))  # transformers 5.x layout (num_local_experts, rope_parameters)
    assert {**theirs.__dict__, "torch_dtype": None} == {**ours.__dict__, "torch_dtype": None}
    assert ModelArch.from_hf_config(ours.to_hf_config()) == ours


def test_hf_twin_of_a_dummy_model_agrees() -> None:
    """Our dummy weights in HF's class (hf_state_dict's names) give the same next-token logits."""
    net, arch = load_model("dummy:tiny-qwen3-moe", torch.float32, torch.device("cpu"), seed=3)
    hf = hf_twin(net, arch)
    prompt = random_prompts(arch.vocab_size, seed=4, lengths=(12,))[0]
    llm_ids, _ = hf_greedy(hf, prompt, 4)
    llm = LLM("dummy:tiny-qwen3-moe", dtype="float32", device="cpu", seed=3, block_size=4)
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert out.token_ids == llm_ids


def test_real_shapes_parse() -> None:
    mixtral, qwen = read_arch("dummy:mixtral-8x7b"), read_arch("dummy:qwen3-30b-a3b")
    assert (mixtral.num_experts, mixtral.num_experts_per_tok, mixtral.moe_intermediate_size) == (8, 2, 14336)
    assert mixtral.norm_topk_prob and mixtral.sliding_window is None and not mixtral.qk_norm
    assert (qwen.num_experts, qwen.num_experts_per_tok, qwen.moe_intermediate_size) == (128, 8, 768)
    assert qwen.norm_topk_prob and qwen.qk_norm and qwen.head_dim == 128
    assert all(qwen.is_moe_layer(i) for i in range(qwen.num_hidden_layers))


def test_sparse_step_and_mlp_only_layers_pick_the_dense_layers() -> None:
    arch = ModelArch.from_hf_config({**PRESETS["tiny-qwen3-moe"], "num_hidden_layers": 6, "decoder_sparse_step": 2,
                                     "mlp_only_layers": [3]})
    assert [arch.is_moe_layer(i) for i in range(6)] == [False, True, False, False, False, True]
    with torch.device("meta"):
        from tritongen.models.moe import MoEForCausalLM

        net = MoEForCausalLM(arch)
    assert [isinstance(layer.mlp, SparseMoeBlock) for layer in net.model.layers] == [arch.is_moe_layer(i)
                                                                                   for i in range(6)]
    assert net.model.layers[0].mlp.gate_proj.out_features == arch.intermediate_size


@torch.no_grad()
def test_fuse_projections_keeps_experts_stacked_and_hf_names() -> None:
    """What the runner does on CUDA: q/k/v (and Qwen3-MoE's dense layer's gate/up) stack; the
    experts stay as they are; outputs and HF-named weights are unchanged."""
    from tritongen.ops.attention import build_attention_metadata

    net, arch = load_model("dummy:tiny-qwen3-moe", torch.float32, torch.device("cpu"))
    before = {k: v.clone() for k, v in net.hf_state_dict().items()}
    ids, positions = torch.randint(3, 1000, (7,)), torch.arange(7)
    meta = build_attention_metadata([7], [7], [[0, 1]], 4)

    def run() -> torch.Tensor:
        caches = [torch.zeros(net.kv_cache_shape(4, 4)) for _ in range(arch.num_hidden_layers)]
        return net(ids, positions, caches, meta)

    expected = run()
    net.fuse_projections()
    assert net.model.layers[1].mlp.gate_up_proj is not None  # the dense layer
    assert isinstance(net.model.layers[0].mlp, SparseMoeBlock)
    after = net.hf_state_dict()
    assert set(after) == set(before) and all(torch.equal(after[k], before[k]) for k in before)
    torch.testing.assert_close(run(), expected, atol=0, rtol=0)


def test_routing_renormalizes_as_the_config_says() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    w, ids = moe.select_experts(logits, 2, renormalize=True)
    probs = torch.softmax(logits, -1)
    assert ids.tolist() == [[0, 1]]
    torch.testing.assert_close(w, probs[:, :2] / probs[:, :2].sum())
    w_raw, _ = moe.select_experts(logits, 2, renormalize=False)
    torch.testing.assert_close(w_raw, probs[:, :2])


def test_a_checkpoint_missing_an_expert_is_refused(family, tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    _, saved, _, _ = family
    with safe_open(str(saved / "model.safetensors"), framework="pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys() if ".experts.1." not in k or "layers.0." not in k}
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((saved / "config.json").read_text())
    with pytest.raises(ValueError, match=r"lacks 2 parameters.*layers\.0\.mlp\.experts\.w"):
        load_model(str(tmp_path), torch.float32, torch.device("cpu"))


def test_tensor_parallelism_accepts_moe() -> None:
    for preset in FAMILIES.values():  # experts split per rank: tests/parallel/test_tp_families.py
        validate_tensor_parallel(read_arch(f"dummy:{preset}"), 2)


@pytest.mark.parametrize("change, message", [
    ({"num_experts_per_tok": 9}, "num_experts_per_tok 9 must be in"),
    ({"shared_expert_intermediate_size": 64}, "shared_expert_intermediate_size"),
    ({"hidden_act": "gelu"}, "unsupported hidden_act"),
])
def test_unsupported_options_are_refused_by_name(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelArch.from_hf_config({**PRESETS["tiny-qwen3-moe"], **change})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_engine_matches_hf(family, default_model_dir) -> None:
    """On CUDA (fused MoE Triton kernels, Triton attention, CUDA graphs) against HF on CUDA, float32."""
    arch_name, saved, _, hf_cpu = family
    hf = copy.deepcopy(hf_cpu).cuda()
    llm = LLM(str(saved), tokenizer=default_model_dir, dtype="float32", device="cuda", block_size=16,
              max_num_batched_tokens=32, num_blocks=256)
    prompts = random_prompts(hf.config.vocab_size, seed=6, lengths=(1, 9, 41, 70))
    try:
        check_batch(llm, prompts, lambda prompt: hf_greedy(hf, prompt, MAX_TOKENS), arch_name)
    finally:
        llm.shutdown()


def _triton_helpers():
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "triton"))
    import triton_helpers

    return triton_helpers


@pytest.mark.parametrize("preset", list(FAMILIES.values()))
def test_openai_server_chat_smoke(preset: str, default_model_dir) -> None:
    """Each MoE family behind the real OpenAI server: chat through the tokenizer's template, greedy."""
    check_openai_chat(preset, default_model_dir)


def test_triton_server_smoke(tmp_path: Path, default_model_dir) -> None:
    """tiny-mixtral behind a real tritonserver (CPU): HTTP /generate gives the engine's greedy text."""
    th = _triton_helpers()
    try:
        from tritongen.triton.launcher import TritonServer, find_tritonserver

        find_tritonserver()
        import tritonclient.http  # noqa: F401
    except (FileNotFoundError, ImportError):
        pytest.skip("tritonserver (nvidia-pytriton) or tritonclient is not installed")
    from tritongen.triton.repo import write_repository

    options = {**th.TINY, "model": "dummy:tiny-mixtral"}
    prompt = "The capital of France is"
    want = LLM(**options).generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    repo = write_repository(tmp_path / "repo", options)
    http, grpc, metrics = th.free_ports(3)
    server = TritonServer(repo, http_port=http, grpc_port=grpc, metrics_port=metrics, log_file=tmp_path / "server.log",
                          model_control="explicit", load_models=["*"], exit_timeout_s=30)
    server.start()
    try:
        server.wait_ready(timeout=300)
        body = {"text_input": prompt, "exclude_input_in_output": True, "max_tokens": 8, "temperature": 0.0,
                "ignore_eos": True}
        assert th.generate(server.http_url, "llm", body)["text_output"] == want.text
    finally:
        server.stop()
        assert server.process.poll() is not None


def test_parameter_counts_of_preflight_and_roofline(family) -> None:
    """preflight (memory) counts every expert; the roofline's per-token count only the routed ones."""
    from tritongen.bench import roofline
    from tritongen.preflight import num_params

    arch_name, _, _, hf = family
    arch = read_arch(f"dummy:{FAMILIES[arch_name]}")
    total = sum(p.numel() for p in hf.parameters())
    assert num_params(arch) == roofline.total_params(arch) == total
    h, i = arch.hidden_size, arch.moe_intermediate_size
    moe_layers = sum(arch.is_moe_layer(n) for n in range(arch.num_hidden_layers))
    idle = moe_layers * (arch.num_experts - arch.num_experts_per_tok) * 3 * h * i
    assert roofline.matmul_params(arch) == total - idle - arch.vocab_size * h  # the embedding is gathered
