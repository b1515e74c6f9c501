"""Our paged Llama-family model against HF transformers (the ground truth), in float32 on CPU.

Every case runs our model over a paged KV cache with a shuffled block table and compares logits
with one full-sequence HF forward. HF runs with eager attention, whose arithmetic our reference
reproduces, so differences stay near float32 rounding.
"""
from __future__ import annotations

import copy
import functools
import json
import random
from pathlib import Path

import pytest
import torch

from tritongen.models.arch import SUPPORTED_ARCHITECTURES, ModelArch
from tritongen.models.loader import (
    build_empty_model,
    hf_config_dict,
    init_dummy_weights,
    load_model,
    read_arch,
)
from tritongen.models.presets import PRESETS
from tritongen.ops import reference
from tritongen.ops.attention import build_attention_metadata, write_kv_cache

transformers = pytest.importorskip("transformers")

ATOL = 1e-4
BLOCK_SIZE = 4
NUM_BLOCKS = 64
CPU = torch.device("cpu")


def _derived_configs() -> dict[str, dict]:
    linear = copy.deepcopy(PRESETS["tiny-llama"])
    linear["rope_scaling"] = {"type": "linear", "factor": 2.0}  # old "type" spelling
    qwen_swa = copy.deepcopy(PRESETS["tiny-qwen2"])
    qwen_swa.update(use_sliding_window=True, sliding_window=8, max_window_layers=1)
    return {"tiny-llama-linear": linear, "tiny-qwen2-swa": qwen_swa}


CONFIGS = {name: PRESETS[name] for name in
           ("tiny-llama", "tiny-llama-mha", "tiny-qwen2", "tiny-mistral", "tiny-llama3")}
CONFIGS.update(_derived_configs())


def _hf_twin(net: torch.nn.Module, arch: ModelArch) -> torch.nn.Module:
    d = arch.to_hf_config()
    config = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    assert type(hf).__name__ == arch.architecture
    hf.load_state_dict(net.state_dict(), strict=True)
    return hf.eval()


@functools.lru_cache(maxsize=None)
def _pair(name: str) -> tuple[torch.nn.Module, ModelArch, torch.nn.Module]:
    arch = ModelArch.from_hf_config(CONFIGS[name])
    net = build_empty_model(arch, torch.float32, CPU)
    init_dummy_weights(net, seed=0)
    return net.eval(), arch, _hf_twin(net, arch)


@torch.no_grad()
def _hf_logits(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    return hf(torch.tensor([ids])).logits[0].float()


def _kv_caches(arch: ModelArch) -> list[torch.Tensor]:
    # NaN-filled so that reading a slot nobody wrote poisons the output.
    shape = (2, NUM_BLOCKS, BLOCK_SIZE, arch.num_key_value_heads, arch.head_dim)
    return [torch.full(shape, float("nan")) for _ in range(arch.num_hidden_layers)]


class _Seq:
    """A sequence with a random, non-contiguous block table drawn from a shared free list."""

    def __init__(self, ids: list[int], free_blocks: list[int]) -> None:
        self.ids = ids
        n = -(-len(ids) // BLOCK_SIZE)
        self.table = [free_blocks.pop() for _ in range(n)]
        self.done = 0


@torch.no_grad()
def _step(net, kv, chunks: list[tuple[_Seq, int]]) -> list[torch.Tensor]:
    """Feed each sequence its next q_len tokens in one flat batch; logits per sequence."""
    ids, pos = [], []
    for seq, q_len in chunks:
        ids += seq.ids[seq.done:seq.done + q_len]
        pos += range(seq.done, seq.done + q_len)
    meta = build_attention_metadata([q for _, q in chunks], [s.done + q for s, q in chunks],
                                    [s.table for s, _ in chunks], BLOCK_SIZE)
    logits = net.compute_logits(net(torch.tensor(ids), torch.tensor(pos), kv, meta))
    out, start = [], 0
    for seq, q_len in chunks:
        out.append(logits[start:start + q_len])
        start += q_len
        seq.done += q_len
    return out


def _free_blocks(seed: int) -> list[int]:
    blocks = list(range(NUM_BLOCKS))
    random.Random(seed).shuffle(blocks)
    return blocks


def _prompt(arch: ModelArch, n: int, seed: int) -> list[int]:
    return torch.randint(0, arch.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefill_matches_hf(name: str) -> None:
    net, arch, hf = _pair(name)
    seq = _Seq(_prompt(arch, 23, seed=1), _free_blocks(1))
    (logits,) = _step(net, _kv_caches(arch), [(seq, len(seq.ids))])
    torch.testing.assert_close(logits, _hf_logits(hf, seq.ids), atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_chunked_prefill_and_decode_match_hf(name: str) -> None:
    net, arch, hf = _pair(name)
    seq = _Seq(_prompt(arch, 26, seed=2), _free_blocks(2))
    kv = _kv_caches(arch)
    pieces = [9, 11] + [1] * 6  # two prefill chunks (the second crosses block edges), then decode
    got = torch.cat([_step(net, kv, [(seq, q)])[0] for q in pieces])
    torch.testing.assert_close(got, _hf_logits(hf, seq.ids), atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-mistral"])
def test_mixed_batch_matches_each_sequence_alone(name: str) -> None:
    net, arch, hf = _pair(name)
    free = _free_blocks(3)
    seqs = [_Seq(_prompt(arch, n, seed=10 + n), free) for n in (7, 20, 12)]
    kv = _kv_caches(arch)
    # Step 1: two whole prompts and the first chunk of the third. Step 2: the first two decode,
    # the third finishes its prompt. Step 3: all three decode together.
    plan = [[(seqs[0], 5), (seqs[1], 18), (seqs[2], 7)],
            [(seqs[0], 1), (seqs[1], 1), (seqs[2], 4)],
            [(seqs[0], 1), (seqs[1], 1), (seqs[2], 1)]]
    got: list[list[torch.Tensor]] = [[], [], []]
    for step in plan:
        for (seq, _), logits in zip(step, _step(net, kv, step)):
            got[seqs.index(seq)].append(logits)
    for seq, parts in zip(seqs, got):
        torch.testing.assert_close(torch.cat(parts), _hf_logits(hf, seq.ids[:seq.done]), atol=ATOL, rtol=0)


@torch.no_grad()
def _our_logits(net, arch: ModelArch, ids: list[int]) -> torch.Tensor:
    return _step(net, _kv_caches(arch), [(_Seq(ids, _free_blocks(0)), len(ids))])[0]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-llama-mha", "tiny-qwen2"])
def test_load_hf_safetensors_directory(name: str, tmp_path: Path) -> None:
    net, arch, hf = _pair(name)
    hf.save_pretrained(tmp_path, max_shard_size="2MB")  # sharded: exercises the index json
    assert (tmp_path / "model.safetensors.index.json").is_file()
    loaded, loaded_arch = load_model(str(tmp_path), torch.float32, CPU)
    assert _strip_dtype(loaded_arch) == _strip_dtype(arch)  # HF's own config.json parses back
    ids = _prompt(arch, 17, seed=4)
    torch.testing.assert_close(_our_logits(loaded, arch, ids), _hf_logits(hf, ids), atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-llama-mha"])
def test_load_pytorch_model_bin(name: str, tmp_path: Path) -> None:
    net, arch, hf = _pair(name)
    (tmp_path / "config.json").write_text(json.dumps(hf_config_dict(f"dummy:{name}")))
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")  # tied lm_head.weight included
    loaded, _ = load_model(str(tmp_path), torch.float32, CPU)
    ids = _prompt(arch, 9, seed=5)
    torch.testing.assert_close(_our_logits(loaded, arch, ids), _hf_logits(hf, ids), atol=ATOL, rtol=0)


def _strip_dtype(arch: ModelArch) -> dict:
    d = dict(arch.__dict__)
    d.pop("torch_dtype")
    return d


def test_dummy_weights_deterministic_and_tied() -> None:
    a, _ = load_model("dummy:tiny-llama-mha", torch.float32, CPU, seed=7)
    b, _ = load_model("dummy:tiny-llama-mha", torch.float32, CPU, seed=7)
    c, _ = load_model("dummy:tiny-llama-mha", torch.float32, CPU, seed=8)
    for (name, x), y, z in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(x, y), name
        assert not torch.equal(x, z), name
    assert a.lm_head.weight is a.model.embed_tokens.weight
    half, _ = load_model("dummy:tiny-qwen2", torch.bfloat16, CPU)
    assert half.model.layers[0].self_attn.q_proj.bias.dtype == torch.bfloat16
    assert half.model.rotary_emb.inv_freq.dtype == torch.float32


def test_arch_parsing_of_real_and_both_rope_layouts() -> None:
    l2, l3 = read_arch("dummy:llama-2-7b"), read_arch("dummy:llama-3-8b")
    assert (l2.head_dim, l2.num_key_value_heads, l2.vocab_size, l2.eos_token_ids) == (128, 32, 32000, (2,))
    assert (l3.num_key_value_heads, l3.vocab_size, l3.rope_theta, l3.eos_token_ids) == (8, 128256, 5e5, (128001,))
    assert read_arch("dummy:llama-2-13b").num_hidden_layers == 40
    new = read_arch("dummy:tiny-llama3")
    classic = dict(PRESETS["tiny-llama3"])
    params = dict(classic.pop("rope_parameters"))
    classic["rope_theta"] = params.pop("rope_theta")
    classic["rope_scaling"] = {"type": params.pop("rope_type"), **params}
    assert ModelArch.from_hf_config(classic) == new
    assert new.eos_token_ids == (2, 0)
    for name in CONFIGS:
        arch = ModelArch.from_hf_config(CONFIGS[name])
        assert ModelArch.from_hf_config(arch.to_hf_config()) == arch, name


@pytest.mark.parametrize("rope_scaling", [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
])
def test_rope_inv_freq_matches_hf(rope_scaling: dict) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(hidden_size=512, num_attention_heads=4, max_position_embeddings=16384,
                                      rope_parameters={"rope_theta": 500000.0, **rope_scaling})
    expected, _ = ROPE_INIT_FUNCTIONS[rope_scaling["rope_type"]](config, CPU)
    assert torch.equal(reference.rope_inv_freq(128, 500000.0, rope_scaling), expected)


def test_rms_norm_matches_hf_in_bfloat16() -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(64, eps=1e-5).to(torch.bfloat16)
    torch.nn.init.normal_(norm.weight, 1.0, 0.1)
    x = torch.randn(5, 64, dtype=torch.bfloat16) * 3
    assert torch.equal(reference.rms_norm(x, norm.weight, 1e-5), norm(x))


def test_write_kv_cache_skips_padding_slots() -> None:
    kv = torch.zeros(2, 3, BLOCK_SIZE, 1, 2)
    k, v = torch.ones(3, 1, 2), torch.full((3, 1, 2), 2.0)
    write_kv_cache(k, v, kv, torch.tensor([5, -1, 8]))
    flat = kv.view(2, -1, 2)
    assert flat[0, 5].eq(1).all() and flat[1, 8].eq(2).all()
    assert int((flat != 0).any(-1).sum()) == 4  # two slots, K and V


def test_loader_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown dummy preset 'nope'.*tiny-llama"):
        load_model("dummy:nope", torch.float32, CPU)
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        load_model(missing, torch.float32, CPU)
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        read_arch(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(PRESETS["tiny-llama"]))
    with pytest.raises(FileNotFoundError, match="no weights"):
        load_model(str(tmp_path), torch.float32, CPU)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MambaForCausalLM"], "hidden_size": 8}))
    with pytest.raises(ValueError, match="MambaForCausalLM") as err:
        read_arch(str(tmp_path))
    assert all(name in str(err.value) for name in SUPPORTED_ARCHITECTURES)
    with pytest.raises(ValueError, match="unsupported rope type 'yarn'"):
        ModelArch.from_hf_config({**PRESETS["tiny-llama"], "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})


@pytest.mark.slow
@torch.no_grad()
def test_real_smollm2_greedy_matches_hf(default_model_dir: str) -> None:
    """The real default model in float32: same greedy tokens as HF generate, logprobs within the
    float32 error expected (1e-4, reasoned below)."""
    tok = transformers.AutoTokenizer.from_pretrained(default_model_dir)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])
    net, arch = load_model(default_model_dir, torch.float32, CPU)
    seq = _Seq(list(prompt), _free_blocks(6))
    seq.table += [NUM_BLOCKS + i for i in range(8)]  # room to decode into (blocks the free list lacks)
    kv = [torch.full((2, 2 * NUM_BLOCKS, BLOCK_SIZE, arch.num_key_value_heads, arch.head_dim), float("nan"))
          for _ in range(arch.num_hidden_layers)]
    logprobs, q_len = [], len(prompt)
    while len(seq.ids) < len(prompt) + 20:
        last = torch.log_softmax(_step(net, kv, [(seq, q_len)])[0][-1], dim=-1)
        seq.ids.append(int(last.argmax()))
        logprobs.append(float(last.max()))
        q_len = 1
    hf = transformers.AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=20, eos_token_id=None,
                      pad_token_id=arch.eos_token_ids[0])
    assert out[0].tolist() == seq.ids
    assert "Paris" in tok.decode(seq.ids[len(prompt):])
    hf_lp = torch.log_softmax(_hf_logits(hf, seq.ids)[len(prompt) - 1:-1], dim=-1)
    expected = hf_lp.gather(1, torch.tensor(seq.ids[len(prompt):])[:, None])[:, 0]
    # The tolerance is the float32 error expected, not what one machine shows. float32 rounds at
    # u = 2**-24 = 6e-8. Each logprob comes out of 30 layers of matmuls whose reductions run over 576
    # (hidden) to 1536 (MLP) terms, and our kernels sum in another order than HF's (paged attention,
    # fused projections, the thread count of the machine), so the two roundings are independent and
    # add up like a random walk: the last hidden state is off by about
    # sqrt(30 layers x 7 matmuls) x sqrt(1536) x u = 14.5 x 39 x 6e-8 = 3.4e-5 of its size. A logprob
    # (l_c - logsumexp(l)) cancels what is common to all logits; what is left scales with the spread
    # of the logits that carry probability, a few units here (the chosen tokens' logprobs lie in
    # [-1.9, 0]): about 1e-4 at worst, a few 1e-5 typically (1.0e-5 and 2.7e-5 seen on two machines;
    # HF's own float32 logprobs are 1e-5 away from its float64 ones). A real bug (rope, norm, a KV
    # slot) moves logprobs by 1e-2 or more, and the greedy tokens above must match exactly anyway.
    torch.testing.assert_close(torch.tensor(logprobs), expected, atol=1e-4, rtol=0)
