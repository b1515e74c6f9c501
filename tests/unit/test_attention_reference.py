"""The reference attention's score terms against HF's own code: Gemma 2's logit softcapping
(transformers' eager_attention_forward) and Bloom's ALiBi (build_alibi_tensor), float32, GQA,
a causal mask with a cached prefix; and the dispatch's per-engine backend."""
import pytest
import torch
from torch import nn

from tritongen.ops import attention, reference


def _case(h=4, hkv=2, d=16, q_len=5, seq_len=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(q_len, h, d, generator=g) * 2
    k = torch.randn(seq_len, hkv, d, generator=g) * 2
    v = torch.randn(seq_len, hkv, d, generator=g)
    return q, k, v, reference.causal_mask(q_len, seq_len, q.device)


@pytest.mark.parametrize("softcap", [None, 50.0, 2.0])
def test_softcap_matches_gemma2_eager_attention(softcap) -> None:
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    q, k, v, mask = _case()
    scale = 16 ** -0.5
    module = nn.Module()
    module.num_key_value_groups, module.head_dim = 2, 16
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))[None, None]
    want, _ = eager_attention_forward(module, q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                      v.transpose(0, 1)[None], additive, scaling=scale, softcap=softcap)
    got = reference.attend(q, k, v, mask, scale, logit_softcap=softcap)
    torch.testing.assert_close(got, want[0], atol=1e-6, rtol=1e-6)
    if softcap == 2.0:  # the cap changes the result (scores of |s| > 2 exist here)
        assert not torch.allclose(got, reference.attend(q, k, v, mask, scale), atol=1e-3)


def test_alibi_matches_bloom_bias() -> None:
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    q, k, v, mask = _case(h=6, hkv=6)
    bias = build_alibi_tensor(torch.ones(1, k.shape[0]), 6, torch.float32)[:, 0, :]  # [H, S]: slope * key pos
    scores = torch.einsum("lhd,shd->hls", q, k) * 16 ** -0.5 + bias[:, None, :]
    want = torch.einsum("hls,shd->lhd", torch.softmax(scores.masked_fill(~mask, float("-inf")), -1), v)
    got = reference.attend(q, k, v, mask, 16 ** -0.5, alibi_slopes=reference.alibi_slopes(6))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_backend_is_the_metadatas_and_cpu_always_takes_the_reference(monkeypatch) -> None:
    """Two engines in one process each name their backend in their AttentionMetadata; nothing
    process-wide decides. CPU tensors take the reference whatever the metadata names."""
    calls = []
    ref = attention._BACKENDS["reference"]
    spy = ref._replace(paged_attention=lambda *a: calls.append(a) or ref.paged_attention(*a))
    monkeypatch.setitem(attention._BACKENDS, "spy", spy)
    q, k, v, _ = _case(q_len=1, seq_len=1)
    meta = attention.build_attention_metadata([1], [1], [[0]], 4, backend="spy")
    kv = torch.zeros(2, 1, 4, 2, 16)
    attention.cached_attention(q, k[:1], v[:1], kv, meta, 0.25)
    assert calls == []  # CPU: the reference
    monkeypatch.setattr(attention, "_backend_for", lambda x, name: attention._BACKENDS[name])  # as on CUDA
    out = attention.cached_attention(q, k[:1], v[:1], kv, meta, 0.25, logit_softcap=30.0)
    assert len(calls) == 1 and calls[0][-1] == 30.0
    meta.backend = "reference"
    torch.testing.assert_close(attention.paged_attention(q, kv, meta, 0.25, logit_softcap=30.0), out)
    assert len(calls) == 1
    with pytest.raises(ValueError, match="unknown attention backend"):
        attention.select_attention_backend("flash", torch.device("cpu"))
