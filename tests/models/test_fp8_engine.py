"""FP8 through the whole engine, float32 on the CPU (where FP8 layers run the dequantizing
reference): a pre-quantized checkpoint in each published format gives the greedy tokens and
logprobs of transformers loading the same checkpoint (dequantized); `quantization="fp8"` on the
bf16 checkpoint equals loading the per-channel checkpoint written from it; bad options fail by name."""
from __future__ import annotations

import json

import pytest
import torch

from tritongen import LLM, SamplingParams
from tritongen.models.fp8_writer import write_fp8_checkpoint
from tritongen.models.hf_twin import hf_greedy
from tritongen.ops.fp8 import E4M3, Fp8Linear, Fp8Scales

transformers = pytest.importorskip("transformers")
MAX_TOKENS = 8
LOGPROB_ATOL = 1e-4  # same float32 argument as tests/models/test_families.py: the weights are equal
ENGINE = dict(dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=16, enable_prefix_caching=True)


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory):
    cfg = transformers.LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                                   bos_token_id=1, eos_token_id=2, max_position_embeddings=256)
    hf = transformers.LlamaForCausalLM(cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen) if p.dim() == 1
                    else torch.randn(p.shape, generator=gen) * 64 ** -0.5)
    out = tmp_path_factory.mktemp("bf16")
    hf.save_pretrained(out)
    return out


def _prompts():
    g = torch.Generator().manual_seed(5)
    return [torch.randint(3, 49152, (n,), generator=g).tolist() for n in (1, 6, 19)]


def _hf_reference(path, fmt, bf16_dir):
    """A plain HF Llama holding the weights transformers dequantized from the checkpoint (the
    compressed-tensors model itself would also fake-quantize activations; our CPU path is the
    weight-only product)."""
    qc = (transformers.FineGrainedFP8Config(dequantize=True) if fmt == "hf-fp8"
          else transformers.CompressedTensorsConfig(run_compressed=False))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(path, quantization_config=qc, dtype=torch.float32)
    state = {k: v for k, v in loaded.state_dict().items() if not k.endswith(("_scale", "_zero_point", "_scale_inv"))}
    plain = transformers.AutoModelForCausalLM.from_pretrained(bf16_dir, dtype=torch.float32,
                                                              attn_implementation="eager")
    plain.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    return plain.eval()


def _generate(llm):
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    return [(o.token_ids, [lp.logprob for lp in o.logprobs]) for o in llm.generate(_prompts(), params)]


@pytest.mark.parametrize("fmt, scales", [("hf-fp8", Fp8Scales("block", (32, 32))),
                                         ("compressed-tensors", Fp8Scales("channel")),
                                         ("compressed-tensors", Fp8Scales("tensor"))],
                         ids=["hf-fp8-block", "ct-channel", "ct-tensor"])
def test_prequantized_checkpoints_match_transformers(bf16_dir, tmp_path, default_model_dir, fmt, scales):
    if fmt == "hf-fp8":
        pytest.importorskip("accelerate")
    else:
        pytest.importorskip("compressed_tensors")
    path = write_fp8_checkpoint(bf16_dir, tmp_path / "fp8", fmt, scales)
    llm = LLM(str(path), tokenizer=default_model_dir, **ENGINE)
    layer = llm.engine.runner.model.model.layers[0].self_attn.q_proj
    assert isinstance(layer, Fp8Linear) and layer.weight.dtype == E4M3 and layer.scales == scales
    assert not isinstance(llm.engine.runner.model.lm_head, Fp8Linear)
    hf = _hf_reference(path, fmt, bf16_dir)
    for prompt, (ids, lps) in zip(_prompts(), _generate(llm)):
        want_ids, want_lps = hf_greedy(hf, prompt, MAX_TOKENS)
        assert ids == want_ids, len(prompt)
        torch.testing.assert_close(torch.tensor(lps), torch.tensor(want_lps), atol=LOGPROB_ATOL, rtol=0)


def test_a_tied_lm_head_stays_the_embedding_whatever_the_checkpoint_ignores(bf16_dir, tmp_path, default_model_dir):
    """A tied model stores no lm_head of its own: with an `ignore` list that does not name lm_head
    the head still is the embedding table, in the model dtype, as with the usual ["lm_head"]."""
    pytest.importorskip("compressed_tensors")
    config = transformers.AutoConfig.from_pretrained(bf16_dir)
    config.tie_word_embeddings = True
    tied = transformers.LlamaForCausalLM.from_pretrained(bf16_dir, config=config)
    tied.lm_head.weight = tied.model.embed_tokens.weight  # tie them: the untied file has its own lm_head
    tied.save_pretrained(tmp_path / "tied")
    runs = []
    for skip in ([], ["lm_head"]):
        path = write_fp8_checkpoint(tmp_path / "tied", tmp_path / f"fp8-{len(skip)}", "compressed-tensors",
                                    skip=skip)
        llm = LLM(str(path), tokenizer=default_model_dir, **ENGINE)
        model = llm.engine.runner.model
        assert isinstance(model.model.layers[0].mlp.down_proj, Fp8Linear)
        assert not isinstance(model.lm_head, Fp8Linear)
        assert model.lm_head.weight is model.model.embed_tokens.weight
        assert model.lm_head.weight.dtype == torch.float32
        runs.append(_generate(llm))
    assert runs[0] == runs[1]


def test_an_fp8_tensor_of_a_layer_the_config_leaves_out_is_refused_by_name(bf16_dir, tmp_path, default_model_dir):
    """lm_head stored in FP8 while quantization_config's ignore list keeps it in the model dtype:
    copying it would drop its scales, so loading stops and names the tensor."""
    path = write_fp8_checkpoint(bf16_dir, tmp_path / "fp8", "compressed-tensors", skip=[])
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["ignore"] = ["lm_head"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="lm_head.weight is stored in torch.float8_e4m3fn but the model keeps"
                                         " lm_head.weight in torch.float32"):
        LLM(str(path), tokenizer=default_model_dir, **ENGINE)


def test_quantization_at_load_equals_the_written_per_channel_checkpoint(bf16_dir, tmp_path, default_model_dir):
    at_load = LLM(str(bf16_dir), tokenizer=default_model_dir, quantization="fp8", **ENGINE)
    assert isinstance(at_load.engine.runner.model.model.layers[1].mlp.down_proj, Fp8Linear)
    written = LLM(str(write_fp8_checkpoint(bf16_dir, tmp_path / "ch", "compressed-tensors")),
                  tokenizer=default_model_dir, **ENGINE)
    plain = LLM(str(bf16_dir), tokenizer=default_model_dir, **ENGINE)
    ours, theirs, bf16 = _generate(at_load), _generate(written), _generate(plain)
    assert ours == theirs
    # fp8 moves the logprobs (it is really quantized), on the first token (same context in both)
    # by e4m3's rounding only: weights off by up to 2**-4 relative, ~2**-6 on average
    first = [abs(la[0] - lb[0]) for (_, la), (_, lb) in zip(ours, bf16)]
    assert 0 < max(first) < 0.25, first


def test_unknown_quantization_is_refused_by_name(bf16_dir, default_model_dir):
    with pytest.raises(ValueError, match="quantization must be one of \\['fp8'\\]"):
        LLM(str(bf16_dir), tokenizer=default_model_dir, quantization="int3", **ENGINE)


@pytest.mark.parametrize("preset, producers", [
    ("tiny-llama", ("rms_norm", "rms_norm", "silu_mul")),
    ("tiny-gemma2", (None, None, None)),  # its sandwich norms never hand quantized tokens; GeGLU neither
])
def test_fp8_producers_are_marked_only_where_the_model_hands_tokens(preset, producers):
    """select_configs times a layer after its producer (Fp8Linear.producer) only where the step
    really runs that producer's quantizing kernel before it: Llama's blocks, not Gemma's."""
    llm = LLM(f"dummy:{preset}", dtype="float32", device="cpu", quantization="fp8")
    model = llm.engine.runner.model
    model.fuse_projections()  # what the CUDA runner does at load
    for layer in model.model.layers:
        got = (layer.self_attn.qkv_proj.producer, layer.mlp.gate_up_proj.producer, layer.mlp.down_proj.producer)
        assert all(isinstance(m, Fp8Linear) for m in (layer.self_attn.qkv_proj, layer.mlp.down_proj))
        assert got == producers


def test_quantize_lm_head_gives_a_tied_model_an_fp8_head_and_keeps_its_embedding():
    """--quantize-lm-head: lm_head (tied to the embedding here) becomes an Fp8Linear of its own,
    per output channel, while the embedding table stays in the model dtype; logits are that
    layer's product, and generation moves only by e4m3's rounding of the head."""
    from tritongen.ops.fp8 import dequantize_weight, fp8_linear_ref

    kw = dict(dtype="float32", device="cpu", quantization="fp8", kv_cache_memory_gb=0.1)
    base = LLM("dummy:tiny-llama-mha", **kw)
    head = LLM("dummy:tiny-llama-mha", quantize_lm_head=True, **kw)
    bm, hm = base.engine.runner.model, head.engine.runner.model
    assert bm.arch.tie_word_embeddings and bm.lm_head.weight is bm.model.embed_tokens.weight
    assert isinstance(hm.lm_head, Fp8Linear) and hm.lm_head.scales == Fp8Scales("channel")
    assert hm.model.embed_tokens.weight.dtype == torch.float32
    torch.testing.assert_close(hm.model.embed_tokens.weight, bm.model.embed_tokens.weight, rtol=0, atol=0)
    table = bm.model.embed_tokens.weight
    dequantized = dequantize_weight(hm.lm_head.weight, hm.lm_head.weight_scale, hm.lm_head.scales)
    assert 0 < (dequantized - table).abs().max() <= table.abs().max() * 2 ** -3
    h = torch.randn(3, bm.arch.hidden_size, generator=torch.Generator().manual_seed(2))
    want = fp8_linear_ref(h, hm.lm_head.weight, hm.lm_head.weight_scale, hm.lm_head.scales, dynamic=False)
    torch.testing.assert_close(hm.compute_logits(h), want.float())
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=0)
    ours, theirs = head.generate([[5, 17, 300, 42]], params)[0], base.generate([[5, 17, 300, 42]], params)[0]
    first = abs(ours.logprobs[0].logprob - theirs.logprobs[0].logprob)
    assert 0 < first < 0.25, first


def test_quantize_lm_head_without_fp8_or_with_tensor_parallelism_is_refused():
    with pytest.raises(ValueError, match="quantize_lm_head applies to quantization='fp8'.*got quantization=None"):
        LLM("dummy:tiny-llama", device="cpu", quantize_lm_head=True)
    with pytest.raises(ValueError, match="not supported with tensor_parallel_size > 1"):
        LLM("dummy:tiny-llama", device="cpu", quantization="fp8", quantize_lm_head=True, tensor_parallel_size=2)
