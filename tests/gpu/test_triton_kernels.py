"""Triton kernels against the reference ops on random inputs. Runs on CUDA, else on the CPU through
Triton's interpreter when the triton package is installed (CI installs it with the dev extras),
or when TRITONGEN_TEST_TRITON_INTERPRET=1."""
import importlib.util
import os
import random

import pytest
import torch

# tests/conftest.py sets TRITON_INTERPRET without CUDA when triton is installed (before any import).
INTERPRET = (os.environ.get("TRITONGEN_TEST_TRITON_INTERPRET") == "1" or os.environ.get("TRITON_INTERPRET") == "1"
             ) and importlib.util.find_spec("triton") is not None
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"
if not (torch.cuda.is_available() or INTERPRET):
    pytest.skip("needs CUDA (or TRITONGEN_TEST_TRITON_INTERPRET=1)", allow_module_level=True)
pytest.importorskip("triton")

from tritongen.ops import reference  # noqa: E402
from tritongen.ops.attention import build_attention_metadata  # noqa: E402
from tritongen.ops import triton_kv_write as tkw  # noqa: E402
from tritongen.ops.triton_attention import paged_attention_triton  # noqa: E402
from tritongen.ops.triton_kv_write import write_kv_cache_triton  # noqa: E402

DEVICE = "cpu" if INTERPRET else "cuda"
CASES = [  # (num_heads, num_kv_heads, head_dim, block_size, [(q_len, seq_len), ...], window)
    (4, 4, 32, 16, [(7, 7), (1, 40), (20, 50)], None),            # MHA: prefill, decode, extend
    (9, 3, 64, 16, [(1, 33), (1, 1), (12, 12), (5, 70)], None),   # SmolLM2-like GQA group 3
    (8, 2, 64, 8, [(30, 30), (1, 90)], 16),                        # sliding window
    (32, 8, 128, 16, [(1, 300), (1, 17), (64, 64)], None),        # Llama-3 shape
]


def _random_case(h, hkv, d, bs, seqs, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-s // bs) for _, s in seqs) + 3
    ids = list(range(num_blocks))
    random.Random(seed).shuffle(ids)
    tables, it = [], iter(ids)
    for _, s in seqs:
        tables.append([next(it) for _ in range(-(-s // bs))])
    kv = torch.randn(2, num_blocks, bs, hkv, d, generator=g).to(DEVICE, dtype)
    meta = build_attention_metadata([q for q, _ in seqs], [s for _, s in seqs], tables, bs, DEVICE)
    T = sum(q for q, _ in seqs)
    q = torch.randn(T, h, d, generator=g).to(DEVICE, dtype)
    k = torch.randn(T, hkv, d, generator=g).to(DEVICE, dtype)
    v = torch.randn(T, hkv, d, generator=g).to(DEVICE, dtype)
    return q, k, v, kv, meta


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_and_attention_match_reference(case, dtype):
    h, hkv, d, bs, seqs, window = case
    if INTERPRET and dtype is torch.bfloat16:
        pytest.skip("the interpreter computes bf16 through numpy float32; covered on CUDA")
    q, k, v, kv, meta = _random_case(h, hkv, d, bs, seqs, dtype)
    kv_ref = kv.clone()
    reference.write_kv_cache_ref(k, v, kv_ref, meta.slot_mapping)
    write_kv_cache_triton(k, v, kv, meta.slot_mapping)
    assert torch.equal(kv, kv_ref)
    expected = reference.paged_attention_ref(q, kv_ref, meta, d ** -0.5, window)
    got = paged_attention_triton(q, kv, meta, d ** -0.5, window)
    tol = 2e-5 if dtype is torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)


SPLIT_CASES = [  # (num_heads, num_kv_heads, head_dim, block_size, [seq_len, ...], window), one query token each
    (4, 4, 32, 16, [1], None),                   # MHA, batch 1: a single visible key, 15 of 16 splits empty
    (4, 4, 32, 16, [1000], None),                # every split non-empty, the last one partial (1000 = 15*64 + 40)
    (4, 1, 32, 16, [1, 70, 333], None),          # GQA 4/1, batch 3: lengths off the page and BLOCK_N grid
    (4, 2, 64, 8, [130, 5, 1000], None),         # GQA 4/2
    (9, 3, 64, 16, [33, 200], None),             # group 3: rows padded to 16 for tl.dot
    (8, 2, 64, 8, [90, 1, 40, 1000], 16),        # sliding window, shorter and longer than the context
    (4, 2, 32, 16, [700, 61], 100),              # window start off the BLOCK_N grid, splits over the window only
]


@pytest.mark.parametrize("case", SPLIT_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_decode_matches_reference(case, dtype, monkeypatch):
    from tritongen.ops import triton_attention as ta

    h, hkv, d, bs, seq_lens, window = case
    if INTERPRET and dtype is torch.bfloat16:
        pytest.skip("the interpreter computes bf16 through numpy float32; covered on CUDA")
    assert ta.decode_splits(len(seq_lens), hkv) > 1
    monkeypatch.setattr(ta, "_paged_attn_kernel", None)  # the unsplit kernel must not run
    q, _, _, kv, meta = _random_case(h, hkv, d, bs, [(1, s) for s in seq_lens], dtype)
    expected = reference.paged_attention_ref(q, kv, meta, d ** -0.5, window)
    got = ta.paged_attention_triton(q, kv, meta, d ** -0.5, window)
    tol = 2e-5 if dtype is torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)


def test_split_decode_skips_sequences_without_a_query_and_zeroes_empty_contexts():
    """A sequence with no token this step keeps its (absent) rows untouched; a context of 0 keys
    (every split empty) gives 0, not NaN."""
    from tritongen.ops import triton_attention as ta

    q, _, _, kv, meta = _random_case(4, 2, 32, 16, [(1, 40), (0, 20), (1, 5)], torch.float32)
    got = ta.paged_attention_triton(q, kv, meta, 32 ** -0.5)
    torch.testing.assert_close(got, reference.paged_attention_ref(q, kv, meta, 32 ** -0.5), atol=2e-5, rtol=2e-5)
    meta.seq_lens.zero_()
    assert torch.equal(ta.paged_attention_triton(q, kv, meta, 32 ** -0.5), torch.zeros_like(q))


def test_decode_splits_depend_on_the_batch_shape_only():
    from tritongen.ops.triton_attention import MAX_SPLITS, SPLIT_BELOW_PROGRAMS, decode_splits

    assert decode_splits(1, 32) == 16  # Llama-2-7B batch 1: 512 programs instead of 32
    assert decode_splits(1, 8) == MAX_SPLITS  # capped
    assert decode_splits(2, 32) == 8
    assert decode_splits(3, 30) == 4
    assert decode_splits(1, SPLIT_BELOW_PROGRAMS - 1) == 4
    assert decode_splits(4, 32) == decode_splits(1, SPLIT_BELOW_PROGRAMS) == 1  # enough programs unsplit
    for seqs in range(1, 40):
        for kv_heads in (1, 2, 3, 8, 32):
            n = decode_splits(seqs, kv_heads)
            assert n & (n - 1) == 0 and n <= MAX_SPLITS


def test_padding_slots_are_not_written():
    q, k, v, kv, meta = _random_case(4, 4, 32, 16, [(3, 3)], torch.float32)
    before = kv.clone()
    write_kv_cache_triton(k, v, kv, torch.full_like(meta.slot_mapping, -1))
    assert torch.equal(kv, before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 64, 4, 2, 32), (3, 576, 9, 3, 64), (2, 4096, 32, 8, 128)])
def test_elementwise_kernels_match_reference(dtype, shape):
    from tritongen.ops import triton_elementwise as te

    if INTERPRET and dtype is torch.bfloat16:
        pytest.skip("the interpreter computes bf16 through numpy float32; covered on CUDA")
    T, hidden, hq, hk, d = shape
    g = torch.Generator().manual_seed(1)
    x = torch.randn(T, hidden, generator=g).to(DEVICE, dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(DEVICE, dtype)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype is torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(te.rms_norm(x, w, 1e-5), reference.rms_norm(x, w, 1e-5), **tol)
    up = torch.randn(T, hidden, generator=g).to(DEVICE, dtype)
    normed, summed = te.add_rms_norm(x, up, w, 1e-5)
    want_normed, want_summed = reference.add_rms_norm(x, up, w, 1e-5)
    assert torch.equal(summed, want_summed)  # the residual stream is rounded exactly as x + up
    torch.testing.assert_close(normed, want_normed, **tol)
    # Gemma's form: (1 + weight) applied in float32 before the one rounding.
    torch.testing.assert_close(te.rms_norm(x, w, 1e-6, 1.0), reference.rms_norm(x, w, 1e-6, 1.0), **tol)
    normed, summed = te.add_rms_norm(x, up, w, 1e-6, 1.0)
    want_normed, want_summed = reference.add_rms_norm(x, up, w, 1e-6, 1.0)
    assert torch.equal(summed, want_summed)
    torch.testing.assert_close(normed, want_normed, **tol)
    torch.testing.assert_close(te.silu_and_mul(x, up), reference.silu_and_mul(x, up), **tol)
    for name, c0 in reference.TANH_GELU_C0.items():
        torch.testing.assert_close(te.gelu_tanh(x, c0), reference.activation(x, name), **tol)
        torch.testing.assert_close(te.gelu_tanh(x, c0, up), reference.activation(x, name) * up, **tol)
    q = torch.randn(T, hq, d, generator=g).to(DEVICE, dtype)
    k = torch.randn(T, hk, d, generator=g).to(DEVICE, dtype)
    inv = reference.rope_inv_freq(d, 10000.0).to(DEVICE)
    cos, sin = reference.rope_cos_sin(torch.arange(7, 7 + T, device=DEVICE), inv)
    for got, want in zip(te.apply_rotary(q, k, cos, sin), reference.apply_rotary(q, k, cos, sin)):
        torch.testing.assert_close(got, want, **tol)


def _layer_norm_case(T, hidden, dtype):
    g = torch.Generator().manual_seed(2)
    x = (3 * torch.randn(T, hidden, generator=g) + 0.5).to(DEVICE, dtype)  # a mean far from 0
    up = torch.randn(T, hidden, generator=g).to(DEVICE, dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(DEVICE, dtype)
    b = (0.1 * torch.randn(hidden, generator=g)).to(DEVICE, dtype)
    return x, up, w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T, hidden", [(3, 576), (2, 1000), (4, 768), (2, 4096)])
def test_layer_norm_kernels_match_reference(dtype, T, hidden):
    """GPT-2's and Bloom's LayerNorm, alone and after the residual add; hidden sizes that are no
    power of two leave the row's last block partly masked."""
    from tritongen.ops import triton_elementwise as te

    if INTERPRET and dtype is torch.bfloat16:
        pytest.skip("the interpreter computes bf16 through numpy float32; covered on CUDA and by the test below")
    x, up, w, b = _layer_norm_case(T, hidden, dtype)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype is torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(te.layer_norm(x, w, b, 1e-5), reference.layer_norm(x, w, b, 1e-5), **tol)
    torch.testing.assert_close(te.layer_norm(x, w, None, 1e-5), reference.layer_norm(x, w, None, 1e-5), **tol)
    normed, summed = te.add_layer_norm(x, up, w, b, 1e-5)
    want_normed, want_summed = reference.add_layer_norm(x, up, w, b, 1e-5)
    assert torch.equal(summed, want_summed)  # the residual stream is rounded exactly as x + up
    torch.testing.assert_close(normed, want_normed, **tol)
    strided = torch.cat([x, up], dim=-1)[:, :hidden]  # rows hidden * 2 apart
    torch.testing.assert_close(te.layer_norm(strided, w, b, 1e-5), reference.layer_norm(x, w, b, 1e-5), **tol)


@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("T, hidden", [(3, 576), (2, 1000), (2, 3584)])
def test_norm_add_norm_kernel_is_the_two_kernels_it_replaces(T, hidden, offset):
    """Gemma's sandwich norm, residual add and the next norm in one kernel give, bit for bit, the
    RMSNorm kernel's output fed to the add + RMSNorm kernel (the same arithmetic and roundings),
    and the reference's within float32 reduction order; offset 1 is Gemma's (1 + w), the fused
    kernel's case (offset 0 runs the two kernels)."""
    from tritongen.ops import triton_elementwise as te

    dtype = torch.float32 if INTERPRET else torch.bfloat16
    g = torch.Generator().manual_seed(T * hidden)
    x, residual = (torch.randn(T, hidden, generator=g).to(DEVICE, dtype) for _ in range(2))
    w1, w2 = ((0.1 * torch.randn(hidden, generator=g)).to(DEVICE, dtype) for _ in range(2))
    y, s = te.norm_add_rms_norm(x, residual, w1, w2, 1e-6, offset)
    want_y, want_s = te.add_rms_norm(te.rms_norm(x, w1, 1e-6, offset), residual, w2, 1e-6, offset)
    assert torch.equal(s, want_s) and torch.equal(y, want_y), f"{int((s != want_s).sum())} sums differ"
    ref_y, ref_s = reference.norm_add_rms_norm(x, residual, w1, w2, 1e-6, offset)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype is torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(s, ref_s, **tol)
    torch.testing.assert_close(y, ref_y, **tol)


@pytest.mark.parametrize("T, hidden", [(3, 576), (2, 1000), (2, 4096)])
def test_layer_norm_kernel_rounds_bf16_once_like_the_reference(T, hidden):
    """The reference's bf16 LayerNorm equals its float32 one rounded once (mean, variance, weight and
    bias all in float32); the kernel computes the float32 one, so rounding its output to bf16 must
    give the reference's bf16 bits (in the interpreter too, which cannot round inside a bf16 kernel)."""
    from tritongen.ops import triton_elementwise as te

    x, _, w, b = _layer_norm_case(T, hidden, torch.bfloat16)
    want = reference.layer_norm(x, w, b, 1e-5)
    assert torch.equal(reference.layer_norm(x.float(), w.float(), b.float(), 1e-5).to(torch.bfloat16), want)
    got = te.layer_norm(x.float(), w.float(), b.float(), 1e-5).to(torch.bfloat16)
    # float32 sums in another order may cross a rounding boundary: rarely, and by one bf16 ulp
    assert (got != want).float().mean() < 1e-3
    torch.testing.assert_close(got, want, atol=0, rtol=2 ** -7)


def test_write_kv_with_strided_views_of_a_fused_qkv():
    """k and v as column slices of one [T, q + 2kv] tensor, as fuse_projections produces."""
    hq, hkv, d = 4, 2, 32
    _, _, _, kv, meta = _random_case(hq, hkv, d, 16, [(5, 5)], torch.float32)
    qkv = torch.randn(5, (hq + 2 * hkv) * d, device=DEVICE)
    k = qkv[:, hq * d:(hq + hkv) * d].view(5, hkv, d)
    v = qkv[:, (hq + hkv) * d:].view(5, hkv, d)
    kv_ref = kv.clone()
    reference.write_kv_cache_ref(k, v, kv_ref, meta.slot_mapping)
    write_kv_cache_triton(k.contiguous(), v, kv, meta.slot_mapping)
    assert torch.equal(kv, kv_ref)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rotary_and_kv_write_match_the_two_reference_ops(case, dtype):
    """q, k, v as strided views of one fused qkv output, one padding row (slot -1)."""
    from tritongen.ops.triton_kv_write import rotary_write_kv_triton

    if INTERPRET and dtype is torch.bfloat16:
        pytest.skip("the interpreter computes bf16 through numpy float32; covered on CUDA")
    h, hkv, d, bs, seqs, _ = case
    _, _, _, kv, meta = _random_case(h, hkv, d, bs, seqs, dtype)
    T = meta.slot_mapping.shape[0]
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(T, (h + 2 * hkv) * d, generator=g).to(DEVICE, dtype)
    q, k, v = (part.view(T, -1, d) for part in qkv.split([h * d, hkv * d, hkv * d], dim=1))
    slots = meta.slot_mapping.clone()
    slots[-1] = -1  # a padding row writes nothing
    inv = reference.rope_inv_freq(d, 10000.0).to(DEVICE)
    cos, sin = reference.rope_cos_sin(torch.arange(3, 3 + T, device=DEVICE), inv)
    want_q, want_k = reference.apply_rotary(q, k, cos, sin)
    kv_ref = kv.clone()
    reference.write_kv_cache_ref(want_k, v, kv_ref, slots)
    got_q = rotary_write_kv_triton(q, k, v, cos, sin, kv, slots)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype is torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got_q, want_q, **tol)
    torch.testing.assert_close(kv, kv_ref, **tol)
    untouched = kv_ref.view(2, -1, hkv, d)[:, meta.slot_mapping[-1]]
    assert torch.equal(kv.view(2, -1, hkv, d)[:, meta.slot_mapping[-1]], untouched)


DECODE_CASES = [  # (num_heads, num_kv_heads, head_dim, block_size, [(q_len, seq_len), ...], window), q_len <= 1
    (4, 4, 32, 16, [(1, 40), (1, 1), (0, 20)], None),  # MHA: a context of one key, a sequence without a query
    (9, 3, 64, 16, [(1, 33), (1, 200)], None),          # GQA group 3: rows padded to 16 for tl.dot
    (8, 2, 32, 8, [(1, 130), (0, 5), (1, 70)], None),   # GQA group 4, lengths off the page and BLOCK_N grid
    (8, 2, 64, 8, [(1, 90), (1, 1), (1, 40)], 16),      # sliding window, shorter and longer than the context
    (4, 2, 32, 16, [(1, 300)], 100),                    # window start off the BLOCK_N grid
]


def _qkv_case(h, hkv, d, bs, seqs, dtype, pad=True):
    """q, k, v as strided views of one fused qkv output, cos/sin at each token's position, the cache
    and metadata; with `pad`, a CUDA-graph padding row after the sequences (a context of one key,
    slot -1), whose would-be slot is returned last."""
    seqs = seqs + [(1, 1)] if pad else seqs
    _, _, _, kv, meta = _random_case(h, hkv, d, bs, seqs, dtype)
    T = meta.slot_mapping.shape[0]
    qkv = torch.randn(T, (h + 2 * hkv) * d, generator=torch.Generator().manual_seed(5)).to(DEVICE, dtype)
    q, k, v = (part.view(T, -1, d) for part in qkv.split([h * d, hkv * d, hkv * d], dim=1))
    positions = torch.tensor([p for q_len, s in seqs for p in range(s - q_len, s)], device=DEVICE)
    cos, sin = reference.rope_cos_sin(positions, reference.rope_inv_freq(d, 10000.0).to(DEVICE))
    pad_slot = int(meta.slot_mapping[-1])
    if pad:
        meta.slot_mapping[-1] = -1
    return q, k, v, cos, sin, kv, meta, pad_slot


DECODE_VARIANTS = (  # (case, rotary, ALiBi, logit softcap): every case as Llama runs it, two with the other terms
    [(case, True, False, None) for case in DECODE_CASES]
    + [(DECODE_CASES[i], rotary, alibi, cap) for i in (0, 3)
       for rotary, alibi, cap in ((False, False, None), (True, False, 5.0), (False, True, None), (False, True, 2.0))])


@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("case, rotary, alibi, softcap", DECODE_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_decode_attention_matches_the_reference_path(case, splits, dtype, rotary, alibi, softcap, monkeypatch):
    """decode_attention_triton (rotary where asked, KV write and attention in one kernel; unsplit:
    the write, then the prefill kernel) against the reference's rotary + write_kv_cache_ref +
    paged_attention_ref, with ALiBi slopes and a logit softcap. The cache holds the two-step
    kernels' bits (the padding row's slot untouched), the split counters are back at zero, a second
    call (same inputs, the same keys rewritten) gives the same bits."""
    from tritongen.ops import triton_attention as ta

    h, hkv, d, bs, seqs, window = case
    if INTERPRET and dtype is torch.bfloat16:
        pytest.skip("the interpreter computes bf16 through numpy float32; covered on CUDA")
    monkeypatch.setattr(ta, "decode_splits", lambda num_seqs, num_kv_heads: splits)
    q, k, v, cos, sin, kv, meta, pad_slot = _qkv_case(h, hkv, d, bs, seqs, dtype)
    slopes = reference.alibi_slopes(h).to(DEVICE) if alibi else None
    if not rotary:
        cos = sin = None
    want_q, want_k = reference.apply_rotary(q, k, cos, sin) if rotary else (q, k)
    kv_ref, kv_two_step, before = kv.clone(), kv.clone(), kv.clone()
    reference.write_kv_cache_ref(want_k, v, kv_ref, meta.slot_mapping)
    expected = reference.paged_attention_ref(want_q, kv_ref, meta, d ** -0.5, window, slopes, softcap)
    if rotary:
        tkw.rotary_write_kv_triton(q, k, v, cos, sin, kv_two_step, meta.slot_mapping)
    else:
        tkw.write_kv_cache_triton(k, v, kv_two_step, meta.slot_mapping)
    got = ta.decode_attention_triton(q, k, v, cos, sin, kv, meta, d ** -0.5, window, slopes, softcap)
    assert torch.equal(kv, kv_two_step)
    assert torch.equal(kv.view(2, -1, hkv, d)[:, pad_slot], before.view(2, -1, hkv, d)[:, pad_slot])
    tol = dict(atol=2e-5, rtol=2e-5) if dtype is torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(kv, kv_ref, **tol)  # bf16: the reference rounds each product
    torch.testing.assert_close(got.float(), expected.float(), **tol)
    if splits > 1:
        assert not ta.decode_counters(kv.device, 1).any()
    again = ta.decode_attention_triton(q, k, v, cos, sin, kv, meta, d ** -0.5, window, slopes, softcap)
    assert torch.equal(again, got)
    assert torch.equal(kv, kv_two_step)


TERMS = [(True, None), (False, 5.0), (True, 2.0)]  # (ALiBi, logit softcap): Bloom's and Gemma 2's score terms


@pytest.mark.parametrize("alibi, softcap", TERMS)
@pytest.mark.parametrize("case", [CASES[0], CASES[2], (4, 2, 256, 16, [(9, 9), (1, 40), (6, 30)], 8)])  # + Gemma 2's head_dim
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_extend_and_split_decode_with_alibi_and_softcap_match_reference(case, alibi, softcap, dtype):
    """paged_attention_triton with the score terms: the prefill kernel (prefill, extend, an
    unsplit decode row among them) and the split decode of the same cache (one query per sequence)."""
    h, hkv, d, bs, seqs, window = case
    if INTERPRET and dtype is torch.bfloat16:
        pytest.skip("the interpreter computes bf16 through numpy float32; covered on CUDA")
    q, _, _, kv, meta = _random_case(h, hkv, d, bs, seqs, dtype, seed=4)
    slopes = reference.alibi_slopes(h).to(DEVICE) if alibi else None
    tol = 2e-5 if dtype is torch.float32 else 2e-2
    expected = reference.paged_attention_ref(q, kv, meta, d ** -0.5, window, slopes, softcap)
    got = paged_attention_triton(q, kv, meta, d ** -0.5, window, slopes, softcap)
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)
    q1, _, _, kv1, meta1 = _random_case(h, hkv, d, bs, [(1, s) for _, s in seqs], dtype, seed=5)
    expected = reference.paged_attention_ref(q1, kv1, meta1, d ** -0.5, window, slopes, softcap)
    got = paged_attention_triton(q1, kv1, meta1, d ** -0.5, window, slopes, softcap)
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)


def test_rotary_and_cached_attention_take_the_fused_kernel_for_decode_batches_only(monkeypatch):
    """ops.attention.rotary_attention (RoPE families) and cached_attention (ALiBi, learned positions)
    with the backend their metadata name: a decode batch (max_query_len 1; here 16 splits,
    decode_splits' own choice) runs decode_attention_triton alone, a batch with a longer query the
    two steps; both agree with the reference backend, which has no fused decode."""
    from tritongen.ops import attention
    from tritongen.ops import triton_attention as ta

    backend = attention.triton_backend()
    assert backend.decode_attention is ta.decode_attention_triton
    assert attention._BACKENDS["reference"].decode_attention is None
    calls = []
    counted = backend._replace(decode_attention=lambda *a: calls.append(a) or ta.decode_attention_triton(*a))
    monkeypatch.setitem(attention._BACKENDS, "counted", counted)
    monkeypatch.setattr(attention, "_backend_for", lambda x, name: attention._BACKENDS[name])  # as on CUDA
    slopes = reference.alibi_slopes(4).to(DEVICE)
    for seqs, fused in (([(1, 70), (1, 3)], True), ([(3, 70), (1, 5)], False)):
        q, k, v, cos, sin, kv, meta, _ = _qkv_case(4, 2, 32, 16, seqs, torch.float32)
        for run in (lambda kv, meta: attention.rotary_attention(q, k, v, cos, sin, kv, meta, 32 ** -0.5),
                    lambda kv, meta: attention.cached_attention(q, k, v, kv, meta, 32 ** -0.5, alibi_slopes=slopes)):
            kv_ref, kv_got = kv.clone(), kv.clone()
            want = run(kv_ref, meta)
            calls.clear()
            meta.backend = "counted"
            got = run(kv_got, meta)
            meta.backend = "reference"
            assert len(calls) == fused
            torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
            torch.testing.assert_close(kv_got, kv_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seqs, launches", [
    ([(1, 40), (1, 9)], [(16, 0)]),                        # decode only (unsplit): one launch of the small tile
    ([(7, 7), (20, 50)], [(64, 0)]),                       # prompts only: one launch of 64-row tiles
    ([(1, 40), (7, 7), (1, 9), (20, 50)], [(16, 1), (64, 2, 2)]),  # mixed: decode rows apart, the 2 prompts listed
])
def test_mixed_batches_attend_decode_rows_in_their_own_launch(seqs, launches, monkeypatch):
    """A prefill among decodes launches the kernel twice, (block_m, rows[, programs over the listed
    prompts]): the single-token sequences in small tiles, the prompts in 64-row tiles over only
    the sequences the metadata lists (prompt_seqs, set for batches of both kinds), each launch
    skipping the other kind; together they write every row, as the reference computes it."""
    from tritongen.ops import triton_attention as ta

    h, hkv, d, bs = 4, 4, 32, 16
    q, _, _, kv, meta = _random_case(h, hkv, d, bs, seqs, torch.float32, seed=3)
    mixed = any(n == 1 for n, _ in seqs) and any(n > 1 for n, _ in seqs)
    assert (meta.prompt_seqs is None) != mixed
    seen = []
    tiles = ta._paged_tiles
    monkeypatch.setattr(ta, "decode_splits", lambda *a: 1)  # a batch this small would split its decode
    monkeypatch.setattr(ta, "_paged_tiles", lambda *a, **k: seen.append(
        (a[9], a[10]) if a[11] is None else (a[9], a[10], a[11].shape[0])) or tiles(*a, **k))
    got = ta.paged_attention_triton(q, kv, meta, d ** -0.5)
    assert seen == launches
    launches = [launch[:2] for launch in launches]
    expected = reference.paged_attention_ref(q, kv, meta, d ** -0.5)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5)
    single = torch.cat([torch.full((n,), n == 1) for n, _ in seqs]).to(DEVICE)
    for block_m, rows in launches:  # each launch alone writes its own kind's rows and no others
        out = torch.zeros_like(q)
        tiles(q, kv, meta, out, d ** -0.5, None, None, None, 64, block_m, rows)
        mine = {0: torch.ones_like(single), 1: single, 2: ~single}[rows]
        torch.testing.assert_close(out[mine], expected[mine], atol=2e-5, rtol=2e-5)
        assert not out[~mine].any()


@pytest.mark.parametrize("case", [(4, 4, 32, 16), (8, 2, 64, 16)])
def test_a_mixed_graphs_padded_layout_attends_as_the_eager_batch(case):
    """The metadata a mixed step's CUDA graph replays (runner/mixed_graph.py): tokens padded past
    the last sequence, sequence slots without queries, the prompts listed in prompt_seqs (-1
    padded) and host lists that only shape the launches (one slot of every row). The real rows get
    what the unpadded batch gets from the reference (padding rows are never written: row-wise
    layers after attention keep them apart)."""
    from tritongen.ops.attention import AttentionMetadata
    from tritongen.runner.mixed_graph import MAX_PROMPTS

    h, hkv, d, bs = case
    seqs = [(1, 40), (7, 7)] + [(1, 5 + i) for i in range(7)] + [(20, 50), (1, 3)]  # a prompt past MAX_PROMPTS
    q, _, _, kv, meta = _random_case(h, hkv, d, bs, seqs, torch.float32, seed=5)
    n, tokens, slots = q.shape[0], 64, 13
    qsl = meta.query_start_loc_cpu + [n] * (slots - len(seqs))
    lens = meta.seq_lens_cpu + [0] * (slots - len(seqs))
    tables = torch.cat([meta.block_tables, torch.zeros(slots - len(seqs), meta.block_tables.shape[1],
                                                       dtype=torch.int32, device=DEVICE)])
    prompts = [i for i, (k, _) in enumerate(seqs) if k > 1]
    padded = AttentionMetadata(
        slot_mapping=torch.full((tokens,), -1, dtype=torch.int64, device=DEVICE),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=DEVICE), block_tables=tables,
        query_start_loc_cpu=[0] + [tokens] * slots, seq_lens_cpu=[tokens] + [0] * (slots - 1), block_size=bs,
        backend="triton", prompt_seqs=torch.tensor(prompts + [-1] * (MAX_PROMPTS - len(prompts)),
                                                   dtype=torch.int32, device=DEVICE))
    q_pad = torch.cat([q, torch.randn(tokens - n, h, d, device=DEVICE)])
    got = paged_attention_triton(q_pad, kv, padded, d ** -0.5)
    expected = reference.paged_attention_ref(q, kv, meta, d ** -0.5)
    torch.testing.assert_close(got[:n], expected, atol=2e-5, rtol=2e-5)


def test_cpu_tensors_take_the_reference_whatever_the_metadata_names():
    from tritongen.ops import attention

    assert attention._backend_for(torch.zeros(1), "triton") is attention._BACKENDS["reference"]


def test_decode_counters_grow_but_never_during_graph_capture(monkeypatch):
    """The split counters (shared with the split-K GEMMs) are created and grown eagerly only: inside
    CUDA graph capture the zero fill would only be recorded. Outgrown ones stay alive for graphs
    captured with them; growing the GEMMs' partials keeps counters at zero."""
    from tritongen.ops import triton_attention as ta
    from tritongen.ops import triton_gemv

    monkeypatch.setattr(triton_gemv, "_workspaces", {})
    monkeypatch.setattr(triton_gemv, "_retired", [])
    cpu = torch.device("cpu")
    first = ta.decode_counters(cpu, 4)
    assert first.numel() == ta.SPLIT_BELOW_PROGRAMS and not first.any() and first.dtype is torch.int32
    assert ta.decode_counters(cpu, ta.SPLIT_BELOW_PROGRAMS) is first
    grown = ta.decode_counters(cpu, ta.SPLIT_BELOW_PROGRAMS + 1)
    assert grown.numel() == ta.SPLIT_BELOW_PROGRAMS + 1 and any(t is first for t in triton_gemv._retired)
    part, counts = triton_gemv.split_workspace(cpu, 1000, 8)  # a split-K GEMM's first call
    assert part.numel() == 1000 and counts is ta.decode_counters(cpu, 4) and counts.numel() >= grown.numel()
    assert not counts.any()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="during CUDA graph capture"):
        ta.decode_counters(torch.device("cuda", 0), 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="arrival order and graph replays need a GPU")
def test_fused_decode_is_deterministic_across_runs_and_graph_replays():
    """Llama-2-7B's shape at batch 1 over 4000 keys, 16 splits racing for their counters: every eager
    call and every graph replay gives the same bits (the last split combines in split order), the
    cache keeps the same bits, and the counters end at zero."""
    from tritongen.ops import triton_attention as ta

    q, k, v, cos, sin, kv, meta, _ = _qkv_case(32, 32, 128, 16, [(1, 4000)], torch.bfloat16, pad=False)
    assert ta.decode_splits(1, 32) == 16
    kv_two_step = kv.clone()
    q_rot = tkw.rotary_write_kv_triton(q, k, v, cos, sin, kv_two_step, meta.slot_mapping)
    first = ta.decode_attention_triton(q, k, v, cos, sin, kv, meta, 128 ** -0.5)
    assert torch.equal(kv, kv_two_step)
    torch.testing.assert_close(first.float(), reference.paged_attention_ref(q_rot, kv, meta, 128 ** -0.5).float(),
                               atol=2e-2, rtol=2e-2)
    assert all(torch.equal(ta.decode_attention_triton(q, k, v, cos, sin, kv, meta, 128 ** -0.5), first)
               for _ in range(50))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # the eager calls created the counters: capture allocates none
        out = ta.decode_attention_triton(q, k, v, cos, sin, kv, meta, 128 ** -0.5)
    for _ in range(20):
        out.zero_()
        graph.replay()
        assert torch.equal(out, first)
    assert torch.equal(kv, kv_two_step) and not ta.decode_counters(q.device, 1).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m, n, k", [(1, 96, 64), (3, 200, 300), (16, 64, 1000), (8, 33, 17)])
def test_skinny_linear_matches_torch(dtype, m, n, k):
    """Row and column counts that are not multiples of the tiles; float32 accumulation."""
    from tritongen.ops.triton_gemv import skinny_linear

    if INTERPRET and dtype is torch.bfloat16:
        pytest.skip("the interpreter computes bf16 through numpy float32; covered on CUDA")
    g = torch.Generator().manual_seed(m * 1000 + n)
    x = torch.randn(m, k, generator=g).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(DEVICE, dtype)
    b = torch.randn(n, generator=g).to(DEVICE, dtype)
    want = (x.float() @ w.float().T + b.float())
    got = skinny_linear(x, w, b, block_n=32, block_k=64)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype is torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(got.float(), want, **tol)
    out = torch.full((m, n), float("nan"), device=DEVICE, dtype=dtype)  # the row-parallel layers' buffer
    assert skinny_linear(x, w, b, block_n=32, block_k=64, out=out).data_ptr() == out.data_ptr()
    torch.testing.assert_close(out.float(), want, **tol)
    with pytest.raises(ValueError, match="M <= 16"):
        skinny_linear(torch.zeros(17, k, device=DEVICE, dtype=dtype), w)
    with pytest.raises(ValueError, match="out must be contiguous"):
        skinny_linear(x, w, out=out.t() if m > 1 else out[:, :1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("n, k, block_n, block_k, split_k", [
    (96, 300, 32, 64, 2),     # K splits 192 + 108
    (200, 1000, 64, 128, 4),  # 256 x 3 + 232, a ragged last N tile
    (70, 520, 32, 128, 3),    # 256 + 256 + 8
    (33, 17, 32, 64, 4),      # one K tile: three empty splits add zeros
])
def test_skinny_linear_split_k_matches_reference(dtype, m, n, k, block_n, block_k, split_k):
    """Split-K against a float64 reference, with bias and with out=; a second call is bitwise the
    same (the partials are summed in split order) and every tile counter is back at zero."""
    from tritongen.ops import triton_gemv

    if INTERPRET and dtype is torch.bfloat16:
        pytest.skip("the interpreter computes bf16 through numpy float32; covered on CUDA")
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(DEVICE, dtype)
    b = torch.randn(n, generator=g).to(DEVICE, dtype)
    want = x.double() @ w.double().T + b.double()
    cfg = dict(block_n=block_n, block_k=block_k, split_k=split_k)
    got = triton_gemv.skinny_linear(x, w, b, **cfg)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype is torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(got.double(), want, **tol)
    out = torch.full((m, n), float("nan"), device=DEVICE, dtype=dtype)
    assert triton_gemv.skinny_linear(x, w, b, **cfg, out=out).data_ptr() == out.data_ptr()
    assert torch.equal(out, got)
    assert torch.equal(triton_gemv.skinny_linear(x, w, **cfg) + b, got)
    _, counts = triton_gemv._workspaces[x.device]
    assert not counts.any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="arrival order and graph replays need a GPU")
def test_split_k_is_deterministic_across_runs_and_graph_replays():
    """A TP=2 13B o_proj at 1 row, split 4: thousands of programs race for the tile counters, yet
    every eager call and every graph replay gives the same bits, and the counters end at zero."""
    from tritongen.ops import triton_gemv

    w = torch.randn(5120, 2560, device="cuda", dtype=torch.bfloat16) / 2560 ** 0.5
    x = torch.randn(1, 2560, device="cuda", dtype=torch.bfloat16)
    cfg = dict(block_n=32, block_k=128, num_stages=3, split_k=4)
    first = triton_gemv.skinny_linear(x, w, **cfg)
    torch.testing.assert_close(first.float(), x.float() @ w.float().T, atol=3e-2, rtol=3e-2)
    assert all(torch.equal(triton_gemv.skinny_linear(x, w, **cfg), first) for _ in range(50))
    out = torch.empty_like(first)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # the eager calls above sized the workspace: capture allocates nothing
        for _ in range(8):
            triton_gemv.skinny_linear(x, w, **cfg, out=out)
    for _ in range(20):
        out.zero_()
        graph.replay()
        assert torch.equal(out, first)
    assert not triton_gemv._workspaces[x.device][1].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m, n, k, block_n, block_k", [
    (1, 96, 64, 32, 64), (3, 100, 300, 16, 128), (16, 64, 1000, 64, 256), (8, 33, 17, 32, 64)])
def test_gated_gemm_matches_the_unfused_reference(dtype, m, n, k, block_n, block_k):
    """SiLU·mul in the gate/up GEMM's epilogue: the same as the float64 product, split into gate and
    up, through the reference activation; ragged N and K tiles; odd stacks and split-K refused."""
    from tritongen.ops import triton_gemv

    if INTERPRET and dtype is torch.bfloat16:
        pytest.skip("the interpreter computes bf16 through numpy float32; covered on CUDA")
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).to(DEVICE, dtype)
    w = (torch.randn(2 * n, k, generator=g) / k ** 0.5).to(DEVICE, dtype)
    cfg = dict(block_n=block_n, block_k=block_k, num_stages=2 if dtype is torch.float32 else 4)  # shared memory
    got = triton_gemv.gated_skinny_linear(x, w, **cfg)
    assert got.shape == (m, n) and got.dtype == dtype
    gate, up = (x.double() @ w.double().T).chunk(2, dim=-1)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype is torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(got.double(), reference.silu_and_mul(gate, up), **tol)
    # the gate half alone must not do: a kernel that read the wrong half fails here
    assert not torch.allclose(got.double(), reference.silu_and_mul(gate, gate), **tol)
    lead = triton_gemv.gated_linear(x.reshape(1, m, k), w, cfg)
    assert lead.shape == (1, m, n) and torch.equal(lead[0], got)
    with pytest.raises(ValueError, match=r"weight \[2N, K\]"):
        triton_gemv.gated_skinny_linear(x, w[:-1])
    with pytest.raises(ValueError, match="split_k=4"):
        triton_gemv.gated_skinny_linear(x, w, split_k=4)


def test_gated_selection_follows_the_agreed_timings_against_the_unfused_pair(monkeypatch):
    """The fused kernel replaces the GEMM + SiLU·mul pair where it is faster by GATED_MIN_GAIN, on the
    timings the ranks agree on; the choice is what config_for answers from the returned table."""
    from tritongen.ops import triton_gemv

    n_cfg = len(triton_gemv.gated_candidates(torch.float32))
    monkeypatch.setattr(triton_gemv, "_time_gated_case",
                        lambda case, group, gemm: [40.0] + [39.0 if i == 1 else 60.0 for i in range(n_cfg)])
    w64, w48 = torch.zeros(64, 32), torch.zeros(48, 32)

    def agree(times):  # over the ranks the 48-row stack at 1 row only just misses the bound
        out = list(times)
        out[2 * (1 + n_cfg) + 2] = 40.0 * triton_gemv.GATED_MIN_GAIN
        return out

    made = triton_gemv.select_gated_kernels([w64, w48], agree=agree)
    second = triton_gemv.gated_candidates(torch.float32)[1]
    assert made[(64, 32, torch.float32, 1)] == second == triton_gemv.config_for(made, w64, 1)
    assert triton_gemv.config_for(made, w64, triton_gemv.MAX_ROWS) == second
    assert made[(48, 32, torch.float32, 1)] is None and triton_gemv.config_for(made, w48, 1) is None
    assert all(c["split_k"] == 1 for c in triton_gemv.gated_candidates(torch.bfloat16))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="selection times kernels in CUDA graphs")
def test_gated_selection_on_the_gpu_and_dispatch_follows_it(monkeypatch):
    """select_gated_kernels times the real pair and candidates; kernels.gated_linear takes the fused
    kernel only where the engine's choices hold a configuration and no bias is added, with the
    same result."""
    from tritongen.ops import kernels, triton_gemv

    weights = [torch.randn(2 * 1024, 512, device="cuda", dtype=torch.bfloat16) / 512 ** 0.5 for _ in range(4)]
    made = triton_gemv.select_gated_kernels(weights)
    assert set(made) == {(2048, 512, torch.bfloat16, r) for r in (1, triton_gemv.MAX_ROWS)}
    assert all(c is None or c in triton_gemv.gated_candidates(torch.bfloat16) for c in made.values())

    w, x = weights[0], torch.randn(1, 512, device="cuda", dtype=torch.bfloat16)
    with kernels.active(kernels.KernelChoices(triton=True)):
        unfused = kernels.gated_linear(x, w)
    choices = kernels.KernelChoices(triton=True, gated={(2048, 512, torch.bfloat16, 1):
                                                        triton_gemv.gated_candidates(torch.bfloat16)[0]})
    calls = []
    real = triton_gemv.gated_linear
    monkeypatch.setattr(triton_gemv, "gated_linear", lambda x, w, c: calls.append(c) or real(x, w, c))
    with kernels.active(choices):
        fused = kernels.gated_linear(x, w)
        assert len(calls) == 1
        kernels.gated_linear(torch.randn(2, 512, device="cuda", dtype=torch.bfloat16), w)  # 8-row bucket: none
        kernels.gated_linear(x, w, torch.zeros(2048, device="cuda", dtype=torch.bfloat16))  # bias: unfused
    kernels.gated_linear(x, w)  # outside the engine's block: the process default, no choices
    assert len(calls) == 1
    torch.testing.assert_close(fused.float(), unfused.float(), atol=3e-2, rtol=3e-2)


def test_decode_linear_runs_every_candidate_and_keeps_leading_dims():
    """triton_gemv.linear (what kernels.linear calls for decode batches on CUDA) over a [2, 3, K]
    input with each candidate configuration, for a narrow and a wide weight."""
    from tritongen.ops import triton_gemv

    g = torch.Generator().manual_seed(7)
    for n, k in ((48, 160), (160, 48)):
        x = torch.randn(2, 3, k, generator=g).to(DEVICE)
        w = (torch.randn(n, k, generator=g) / k ** 0.5).to(DEVICE)
        for cfg in triton_gemv.candidates(x.dtype):
            got = triton_gemv.linear(x, w, cfg)
            assert got.shape == (2, 3, n)
            torch.testing.assert_close(got, x @ w.T, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="selection times kernels in CUDA graphs")
def test_selection_decides_per_shape_and_dispatch_follows_it(monkeypatch):
    from tritongen.ops import kernels, triton_gemv

    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for n, k in ((4096, 4096), (1024, 256))
               for _ in range(4)]
    made = triton_gemv.select_kernels(weights)
    assert set(made) == {(n, k, torch.bfloat16, r) for n, k in ((4096, 4096), (1024, 256)) for r in (1, 8)}
    assert all(c is None or c in triton_gemv.CANDIDATES for c in made.values())
    made32 = triton_gemv.select_kernels([w.float() for w in weights[:2]])  # fits shared memory too
    assert all(c is None or c in triton_gemv.candidates(torch.float32) for c in made32.values())

    cfg = triton_gemv.CANDIDATES[0]
    calls = []
    monkeypatch.setattr(triton_gemv, "linear", lambda x, w, c, b=None, out=None: calls.append((x.shape[0], c)) or x @ w.T)
    w = torch.randn(64, 32, device="cuda")
    with kernels.active(kernels.KernelChoices(triton=True, gemm={(64, 32, torch.float32, 1): cfg})):
        for rows in (1, 2, triton_gemv.MAX_ROWS + 1):
            kernels.linear(torch.randn(rows, 32, device="cuda"), w)
    kernels.linear(torch.randn(1, 32, device="cuda"), w)  # another engine's (here: no) choices
    assert calls == [(1, cfg)]  # 2 rows: the 8-row bucket has no choice; 9 rows: always cuBLAS


def test_selection_decides_on_the_timings_the_ranks_agree_on(monkeypatch):
    """Tensor-parallel ranks pass `agree` (the mean over ranks): the choice follows its timings, not
    this process's own, so every rank picks the same kernels."""
    from tritongen.ops import triton_gemv

    n_cfg = len(triton_gemv.candidates(torch.float32))
    # Locally the first candidate wins everywhere (9 us against cuBLAS 10 us)...
    monkeypatch.setattr(triton_gemv, "_time_case", lambda case, group: [10.0, 9.0] + [50.0] * (n_cfg - 1))
    weights = [torch.zeros(64, 32), torch.zeros(48, 32)]
    seen = []

    def agree(times):  # ...but over the ranks it loses on the 64-row shape
        seen.append(list(times))
        out = list(times)
        out[1] = 11.0
        return out

    made = triton_gemv.select_kernels(weights, agree=agree)
    assert len(seen) == 1 and len(seen[0]) == 4 * (1 + n_cfg)  # 2 shapes x 2 row buckets, one collective
    assert made[(64, 32, torch.float32, 1)] is None
    first = triton_gemv.candidates(torch.float32)[0]
    assert made[(64, 32, torch.float32, triton_gemv.MAX_ROWS)] == first and made[(48, 32, torch.float32, 1)] == first
