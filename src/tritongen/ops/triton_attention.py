"""Triton-language attention over the paged KV cache: one kernel for prefill and chunked prefill
(extend over a cached prefix), and one fused kernel for decode (the step's KV writes alone are in
ops/triton_kv_write.py).

One program handles one sequence, one KV head and a tile of query rows. Rows pack
(query token, query head of the KV head's group), so GQA loads each KV tile once for the whole
group and decode still fills the tensor-core tile with the group's heads. Keys are walked in
tiles of BLOCK_N slots gathered through the block table, with an online softmax in float32. The
scores take the terms the model families need: a logit softcap (c * tanh(s / c), Gemma 2), an
ALiBi bias (slope of the row's head times the key's position, Bloom), a sliding window.

Small decode batches (one query token per sequence, few sequences x KV heads) would leave most SMs
idle with one program per (sequence, KV head), so they split each context into NUM_SPLITS pieces
("flash-decoding"), in one launch that also does the step's rotary and KV write (batch-1 decode
pays ~2-3 us of fixed cost on an H200 per launch): one program per (sequence, KV head, split)
rotates its query heads as it loads them (RoPE families), the split holding the new token stores
its key (rotated) and value and reads them back through the cache after a CTA barrier, and the last
program of each (sequence, KV head) combines the splits' partial softmax states from float32
scratch, counted in as triton_gemv's split-K does. Decode batches large enough to fill the GPU
unsplit take the KV write and the prefill kernel instead.

An fp8 cache (float8 e4m3, ops/attention_metadata.py) is a constexpr FP8 flag of every kernel:
the writes store x / scale quantized; the attention multiplies the stored e4m3 values as float16
(16-bit queries: k_scale on the scores, V's tiles times v_scale in float16) or dequantizes each
tile in float32 (float32 queries) (ops/triton_kv_fp8.py); the per-layer scales are kernel scalars.

Everything here takes device tensors only (no host lists), so decode steps can be captured in
CUDA graphs. The pure-PyTorch twin is ops/reference.py; tests/gpu compares them. With
TRITON_INTERPRET=1 these kernels also run (slowly) on the CPU, which is how they are tested
without a GPU.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from tritongen.ops.attention_metadata import AttentionMetadata, is_fp8_cache, kv_cache_scales
from tritongen.ops.triton_elementwise import rope_row
from tritongen.ops.triton_gemv import split_workspace
from tritongen.ops.triton_kv_fp8 import fp8_queries, from_cache, inverse_scales, rotate_keys_into_cache, to_cache
from tritongen.ops.triton_kv_write import rotary_write_kv_triton, write_kv_cache_triton


@triton.jit
def _row_slopes(SLOPES, head, row_ok, BLOCK_M: tl.constexpr, ALIBI: tl.constexpr):
    """ALiBi slopes [BLOCK_M] of the rows' query heads (float32); zeros without ALiBi."""
    slopes = tl.zeros([BLOCK_M], tl.float32)
    if ALIBI:
        slopes = tl.load(SLOPES + head, mask=row_ok, other=0.0).to(tl.float32)
    return slopes


@triton.jit
def _attend_tile(q, K, V, BT, seq, kvh, n, n_ok, q_pos, window, d, d_ok, m_i, l_i, acc, scale, slopes, softcap,
                 k_scale, v_scale, stride_bt, stride_kb, stride_ks, stride_kh, PAGE: tl.constexpr,
                 CAUSAL: tl.constexpr, USE_WINDOW: tl.constexpr, ALIBI: tl.constexpr, SOFTCAP: tl.constexpr,
                 IEEE: tl.constexpr, FP8: tl.constexpr):
    """One tile of BLOCK_N key slots (n, gathered through the block table) folded into the online
    softmax state (m_i, l_i, acc) of q's rows. Scores: scaled, capped (SOFTCAP), plus the rows'
    slopes times each key's position (ALIBI), as reference.attend orders them. Visible: slots n_ok;
    with CAUSAL only keys at or before each row's q_pos, and with USE_WINDOW only the last `window`.
    An FP8 cache's tiles: with float16 queries (fp8_queries) the stored values in float16, k_scale
    on the scores and V's tiles times v_scale in float16 as they are converted (the multiply keeps
    the conversion in the load's layout, before the tile goes through shared memory: the tensor
    cores' transposed ldmatrix takes 16-bit tiles, not 8-bit ones); with float32 ones dequantized as
    they are loaded."""
    blk = tl.load(BT + seq * stride_bt + n // PAGE, mask=n_ok, other=0)
    off = blk.to(tl.int64) * stride_kb + (n % PAGE) * stride_ks + kvh * stride_kh
    kv_mask = n_ok[:, None] & d_ok[None, :]
    k = tl.load(K + off[:, None] + d[None, :], mask=kv_mask, other=0.0)
    if FP8 and not IEEE:
        qk = tl.dot(q, tl.trans(k.to(tl.float16))) * (scale * k_scale)
    elif IEEE:
        qk = tl.dot(q, tl.trans(from_cache(k, k_scale, q.dtype, FP8)), input_precision="ieee") * scale
    else:
        qk = tl.dot(q, tl.trans(k)) * scale
    if SOFTCAP:  # c * tanh(s / c), tanh as 1 - 2 / (e^2x + 1): saturates to +-1 without NaN
        qk = softcap * (1.0 - 2.0 / (tl.exp(2.0 * qk / softcap) + 1.0))
    if ALIBI:
        qk = qk + slopes[:, None] * n[None, :].to(tl.float32)
    keep = n_ok[None, :]
    if CAUSAL:
        keep = (n[None, :] <= q_pos[:, None]) & keep
        if USE_WINDOW:
            keep = keep & (n[None, :] > q_pos[:, None] - window)
    qk = tl.where(keep, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(qk - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(V + off[:, None] + d[None, :], mask=kv_mask, other=0.0)
    if FP8 and not IEEE:
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v.to(tl.float16) * tl.cast(v_scale, tl.float16))
    elif IEEE:
        v = from_cache(v, v_scale, q.dtype, FP8)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _paged_attn_kernel(
    Q, K, V, O, BT, SEQ_LENS, QSL, SEQ_MAP, SLOPES, scale, window, softcap, k_scale, v_scale,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_kb, stride_ks, stride_kh, stride_bt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE: tl.constexpr, USE_WINDOW: tl.constexpr, ALIBI: tl.constexpr,
    SOFTCAP: tl.constexpr, IEEE: tl.constexpr, FP8: tl.constexpr, ROWS: tl.constexpr, MAPPED: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    tile = tl.program_id(2)
    TOKS: tl.constexpr = BLOCK_M // GROUP
    mapped_out = False
    if MAPPED:  # program i takes the sequence SEQ_MAP[i] (-1: none)
        seq = tl.load(SEQ_MAP + seq)
        mapped_out = seq < 0
        seq = tl.maximum(seq, 0)
    q_start = tl.load(QSL + seq)
    q_len = tl.load(QSL + seq + 1) - q_start
    skip = (tile * TOKS >= q_len) | mapped_out
    if ROWS == 1:  # this launch takes the sequences of one query token only
        skip = skip | (q_len != 1)
    if ROWS == 2:  # ... or only those of several
        skip = skip | (q_len == 1)
    if skip:
        return
    ctx = tl.load(SEQ_LENS + seq) - q_len  # position of this sequence's first query token
    r = tl.arange(0, BLOCK_M)
    tok = tile * TOKS + r // GROUP
    head = kvh * GROUP + r % GROUP
    row_ok = (r // GROUP < TOKS) & (tok < q_len)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q = tl.load(Q + (q_start + tok)[:, None].to(tl.int64) * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    q = fp8_queries(q, FP8, IEEE)
    slopes = _row_slopes(SLOPES, head, row_ok, BLOCK_M, ALIBI)
    q_pos = ctx + tok
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    hi = ctx + tl.minimum((tile + 1) * TOKS, q_len)  # causal: nothing past the tile's last query
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(ctx + tile * TOKS - window + 1, 0) // BLOCK_N * BLOCK_N
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        m_i, l_i, acc = _attend_tile(q, K, V, BT, seq, kvh, n, n_ok, q_pos, window, d, d_ok, m_i, l_i, acc, scale,
                                     slopes, softcap, k_scale, v_scale, stride_bt, stride_kb, stride_ks, stride_kh,
                                     PAGE, True, USE_WINDOW, ALIBI, SOFTCAP, IEEE, FP8)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(O + (q_start + tok)[:, None].to(tl.int64) * stride_ot + head[:, None] * stride_oh + d[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


# Split-K decode. The split count depends only on the batch shape, never on context lengths: a
# decode step is captured in a CUDA graph per batch size and replayed with other context lengths.
SPLIT_BELOW_PROGRAMS = 128  # decode batches with fewer (sequence, KV head) programs than this split
SPLIT_TARGET_PROGRAMS = 2 * 132  # two waves of programs on the H200's 132 SMs
MAX_SPLITS = 16  # more pieces would only add reduce work; short contexts leave the extra ones empty
DECODE_BLOCK_N = 64
# Single-token rows over an fp8 cache (16-bit queries, head_dim <= 128) in the unsplit kernel: 128
# keys a tile ran 1.03-1.09x faster than 64 (decode_attn_probe --sweep --kv-dtypes fp8, batch 256,
# H100); bf16 caches within 1 % either way.
FP8_DECODE_BLOCK_N = 128


def single_row_block_n(fp8_cache: bool, float32: bool, head_dim: int) -> int:
    """Keys a tile of _paged_attn_kernel's single-token launches (prompt tiles take 64)."""
    return FP8_DECODE_BLOCK_N if fp8_cache and not float32 and head_dim <= 128 else 64


def decode_splits(num_seqs: int, num_kv_heads: int) -> int:
    """How many pieces each context of a decode batch is split into (a power of two; 1 = unsplit:
    the KV write and the prefill kernel): the fewest that give SPLIT_TARGET_PROGRAMS programs, at
    most MAX_SPLITS."""
    programs = num_seqs * num_kv_heads
    if programs >= SPLIT_BELOW_PROGRAMS:
        return 1
    splits = 2
    while splits < MAX_SPLITS and programs * splits < SPLIT_TARGET_PROGRAMS:
        splits *= 2
    return splits


@triton.jit
def _split_range(seq_len, window, split, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, USE_WINDOW: tl.constexpr):
    """(lo, start, end): split `split` of the query at seq_len - 1 walks keys [start, end), those >= lo
    visible (the window). Whole BLOCK_N tiles per split: short contexts leave the last splits empty."""
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(seq_len - window, 0)
    base = lo // BLOCK_N * BLOCK_N
    chunk = tl.cdiv(tl.cdiv(seq_len - base, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = base + split * chunk
    return lo, start, tl.minimum(start + chunk, seq_len)


@triton.jit
def _attend_keys(q, K, V, BT, seq, kvh, lo, start, end, d, d_ok, scale, slopes, softcap, k_scale, v_scale,
                 stride_bt, stride_kb, stride_ks, stride_kh, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_N: tl.constexpr, PAGE: tl.constexpr, ALIBI: tl.constexpr, SOFTCAP: tl.constexpr,
                 IEEE: tl.constexpr, FP8: tl.constexpr):
    """Online-softmax state (m, l, acc) of one decode query's rows over one split's keys (see
    _split_range; no causal mask needed); an empty split gives m=-inf, l=0, acc=0."""
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for tile in range(start, end, BLOCK_N):  # no iterations for an empty split
        n = tile + tl.arange(0, BLOCK_N)
        n_ok = (n < end) & (n >= lo)
        m_i, l_i, acc = _attend_tile(q, K, V, BT, seq, kvh, n, n_ok, end, 0, d, d_ok, m_i, l_i, acc, scale, slopes,
                                     softcap, k_scale, v_scale, stride_bt, stride_kb, stride_ks, stride_kh, PAGE,
                                     False, False, ALIBI, SOFTCAP, IEEE, FP8)
    return m_i, l_i, acc


@triton.jit
def _rotated_q(Q, COS, SIN, t, head, row_ok, d, stride_qt, stride_qh, stride_cos, HALF: tl.constexpr):
    """Rows `head` of token t's query, rotated as rotate_heads rotates them (float32, the same
    products and sums, rounded once to q's dtype) but as one [rows, BLOCK_D] tile for tl.dot: each
    element is loaded beside its rotate-half partner (d +- HALF)."""
    low = d < HALF
    ok = row_ok[:, None] & (d < 2 * HALF)[None, :]
    rows = Q + t.to(tl.int64) * stride_qt + head[:, None] * stride_qh
    x = tl.load(rows + d[None, :], mask=ok, other=0.0).to(tl.float32)
    xp = tl.load(rows + tl.where(low, d + HALF, d - HALF)[None, :], mask=ok, other=0.0).to(tl.float32)
    half = tl.where(low, d, d - HALF)  # cos/sin rows hold duplicated halves: read the first only
    cos = tl.load(COS + t * stride_cos + half, mask=d < 2 * HALF, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(SIN + t * stride_cos + half, mask=d < 2 * HALF, other=0.0).to(tl.float32)[None, :]
    rot = tl.where(low[None, :], x * cos - xp * sin, x * cos + xp * sin)
    return rot.to(Q.dtype.element_ty)


@triton.jit
def _write_new_kv(K, V, COS, SIN, KC, VC, slot, t, kvh, k_inv, v_inv, stride_kt, stride_kh, stride_vt, stride_vh,
                  stride_cos, stride_cs, stride_ch, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                  FP8: tl.constexpr):
    """Token t's key for KV head kvh rotated, and its value, stored at cache slot `slot`: the code
    _rotary_write_kv_kernel runs (rope_row, rotate_keys_into_cache) for one head, so the cache gets
    the same bits."""
    h, d, cos, sin = rope_row(COS, SIN, t, stride_cos, 1, HALF, BLOCK_HALF)
    dst = slot.to(tl.int64) * stride_cs + kvh * stride_ch
    rotate_keys_into_cache(K + t.to(tl.int64) * stride_kt + kvh * stride_kh, KC + dst, cos, sin, stride_kh,
                            stride_ch, h, d, k_inv, 1, HALF, FP8)
    for half in tl.static_range(2):
        src = V + t.to(tl.int64) * stride_vt + kvh * stride_vh + half * HALF + d
        tl.store(VC + dst + half * HALF + d, to_cache(tl.load(src, mask=d < HALF), v_inv, FP8), mask=d < HALF)


@triton.jit
def _copy_new_kv(K, V, KC, VC, slot, t, kvh, k_inv, v_inv, stride_kt, stride_kh, stride_vt, stride_vh, stride_cs,
                 stride_ch, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, FP8: tl.constexpr):
    """Token t's key and value for KV head kvh stored at cache slot `slot` as they are (families
    without rotary): the bits _write_kv_kernel stores."""
    d = tl.arange(0, BLOCK_D)
    ok = d < HEAD_DIM
    dst = slot.to(tl.int64) * stride_cs + kvh * stride_ch + d
    k = tl.load(K + t.to(tl.int64) * stride_kt + kvh * stride_kh + d, mask=ok)
    tl.store(KC + dst, to_cache(k, k_inv, FP8), mask=ok)
    tl.store(VC + dst, to_cache(tl.load(V + t.to(tl.int64) * stride_vt + kvh * stride_vh + d, mask=ok), v_inv, FP8),
             mask=ok)


@triton.jit
def _last_split_reduces(m_i, l_i, acc, PART_M, PART_L, PART_ACC, COUNTS, o_ptrs, o_ok, part, row_ok, d,
                        HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    """Publish this split's partial state (fp32 scratch at part + split), count in on the (sequence,
    KV head)'s counter; the last to arrive combines the splits, stores the output and resets the
    counter for the next launch (graph replays too). As triton_gemv._split_k_reduce: a CTA barrier,
    then one gpu-scope acq_rel atomic releases this program's stores and acquires the others'."""
    m_at, l_at, acc_at = PART_M + part, PART_L + part, PART_ACC + part[:, None] * HEAD_DIM + d[None, :]
    tl.store(m_at + tl.program_id(2), m_i, mask=row_ok)
    tl.store(l_at + tl.program_id(2), l_i, mask=row_ok)
    tl.store(acc_at + tl.program_id(2) * HEAD_DIM, acc, mask=o_ok)
    tl.debug_barrier()
    counter = COUNTS + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == NUM_SPLITS - 1:
        # Split order 0..NUM_SPLITS-1 whichever program came last: bitwise the same every run. Empty
        # splits (m=-inf) weigh 0; no visible key at all gives 0, not NaN. .cg: read other SMs'
        # partials from L2, never from a stale L1 line.
        m_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
        for s in tl.static_range(NUM_SPLITS):
            m_max = tl.maximum(m_max, tl.load(m_at + s, mask=row_ok, other=float("-inf"), cache_modifier=".cg"))
        m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
        l_sum = tl.zeros([BLOCK_M], tl.float32)
        out = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for s in tl.static_range(NUM_SPLITS):
            w = tl.exp(tl.load(m_at + s, mask=row_ok, other=float("-inf"), cache_modifier=".cg") - m_max)
            l_sum += w * tl.load(l_at + s, mask=row_ok, other=0.0, cache_modifier=".cg")
            out += w[:, None] * tl.load(acc_at + s * HEAD_DIM, mask=o_ok, other=0.0, cache_modifier=".cg")
        out = out / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]
        tl.store(o_ptrs, out.to(o_ptrs.dtype.element_ty), mask=o_ok)
        tl.store(counter, 0)


@triton.jit
def _decode_attn_kernel(
    Q, K, V, COS, SIN, KC, VC, O, SLOTS, BT, SEQ_LENS, QSL, SLOPES, PART_M, PART_L, PART_ACC, COUNTS,
    scale, window, softcap, k_scale, v_scale, k_inv, v_inv,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cos, stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE: tl.constexpr, NUM_SPLITS: tl.constexpr, USE_WINDOW: tl.constexpr,
    ROTARY: tl.constexpr, WRITE: tl.constexpr, ALIBI: tl.constexpr, SOFTCAP: tl.constexpr, IEEE: tl.constexpr,
    FP8: tl.constexpr,
):
    seq = tl.program_id(0)  # grid (num_seqs, num_kv_heads, NUM_SPLITS); the module docstring says why
    kvh = tl.program_id(1)
    t = tl.load(QSL + seq)  # the sequence's one query token, at position seq_len - 1
    if tl.load(QSL + seq + 1) == t:
        return  # no query token this step
    seq_len = tl.load(SEQ_LENS + seq)
    lo, start, end = _split_range(seq_len, window, tl.program_id(2), BLOCK_N, NUM_SPLITS, USE_WINDOW)
    r = tl.arange(0, BLOCK_M)  # rows: the GROUP query heads of this KV head, padded for tl.dot
    row_ok = r < GROUP
    head = kvh * GROUP + r
    d = tl.arange(0, BLOCK_D)
    if ROTARY:
        q = _rotated_q(Q, COS, SIN, t, head, row_ok, d, stride_qt, stride_qh, stride_cos, HEAD_DIM // 2)
    else:
        q = tl.load(Q + t.to(tl.int64) * stride_qt + head[:, None] * stride_qh + d[None, :],
                    mask=row_ok[:, None] & (d < HEAD_DIM)[None, :], other=0.0)
    if WRITE:
        slot = tl.load(SLOTS + t)
        # The one split whose keys end at the new token stores it (negative slots: padding rows of
        # CUDA-graph batches), then reads it back through the cache; no other split reads that slot.
        if (start < end) & (end == seq_len) & (slot >= 0):
            if ROTARY:
                _write_new_kv(K, V, COS, SIN, KC, VC, slot, t, kvh, k_inv, v_inv, stride_kt, stride_kh, stride_vt,
                              stride_vh, stride_cos, stride_cs, stride_ch, HEAD_DIM // 2, BLOCK_D // 2, FP8)
            else:
                _copy_new_kv(K, V, KC, VC, slot, t, kvh, k_inv, v_inv, stride_kt, stride_kh, stride_vt, stride_vh,
                             stride_cs, stride_ch, HEAD_DIM, BLOCK_D, FP8)
            tl.debug_barrier()  # every thread's stores are visible to every thread's tile loads
    slopes = _row_slopes(SLOPES, head, row_ok, BLOCK_M, ALIBI)
    q = fp8_queries(q, FP8, IEEE)
    m_i, l_i, acc = _attend_keys(q, KC, VC, BT, seq, kvh, lo, start, end, d, d < HEAD_DIM, scale, slopes, softcap,
                                 k_scale, v_scale, stride_bt, stride_cb, stride_cs, stride_ch, BLOCK_M, BLOCK_D,
                                 BLOCK_N, PAGE, ALIBI, SOFTCAP, IEEE, FP8)
    o_ptrs = O + t.to(tl.int64) * stride_ot + head[:, None] * stride_oh + d[None, :]
    o_ok = row_ok[:, None] & (d < HEAD_DIM)[None, :]
    part = (seq * tl.num_programs(1) * GROUP + head) * NUM_SPLITS  # scratch [num_seqs, num_heads, NUM_SPLITS(, D)]
    _last_split_reduces(m_i, l_i, acc, PART_M, PART_L, PART_ACC, COUNTS, o_ptrs, o_ok, part, row_ok, d,
                        HEAD_DIM, NUM_SPLITS, BLOCK_M, BLOCK_D)


def decode_counters(device: torch.device, n: int) -> torch.Tensor:
    """The fused decode kernel's int32 counters, one per (sequence, KV head) of a split batch: the
    split-K GEMMs' counters (triton_gemv.split_workspace), at least max(n, SPLIT_BELOW_PROGRAMS) so
    that serving never grows them. Sharing is safe: kernels on one stream run one after the other and
    each leaves every counter at zero. Never grown inside CUDA graph capture (the decode graphs run each
    batch size eagerly before capturing it)."""
    return split_workspace(device, 0, max(n, SPLIT_BELOW_PROGRAMS))[1]


def _stride(t: Optional[torch.Tensor], dim: int) -> int:
    return t.stride(dim) if t is not None else 0


def _split_decode(q: torch.Tensor, k: Optional[torch.Tensor], v: Optional[torch.Tensor], cos: Optional[torch.Tensor],
                  sin: Optional[torch.Tensor], kv_cache: torch.Tensor, meta: AttentionMetadata, out: torch.Tensor,
                  scale: float, sliding_window: Optional[int], alibi_slopes: Optional[torch.Tensor],
                  logit_softcap: Optional[float], splits: int) -> None:
    """A decode batch split `splits` ways in one launch of _decode_attn_kernel: with k, v the
    step's keys and values are stored first (rotated by cos/sin when given), without them the
    cache already holds them."""
    num_seqs, (_, num_heads, head_dim), num_kv_heads = meta.seq_lens.shape[0], q.shape, kv_cache.shape[3]
    # Fresh scratch each call (a captured graph keeps it in its memory pool); every partial of a
    # sequence with a query token is written before its counter lets the last program read it.
    part_m, part_l = torch.empty(2, num_seqs, num_heads, splits, dtype=torch.float32, device=q.device)
    part_acc = torch.empty(num_seqs, num_heads, splits, head_dim, dtype=torch.float32, device=q.device)
    counts = decode_counters(q.device, num_seqs * num_kv_heads)
    if cos is not None:
        cos, sin = cos.contiguous(), sin.contiguous()
    kc, vc = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, H, D], contiguous slots
    group = num_heads // num_kv_heads
    _decode_attn_kernel[(num_seqs, num_kv_heads, splits)](
        q, k, v, cos, sin, kc, vc, out, meta.slot_mapping, meta.block_tables, meta.seq_lens, meta.query_start_loc,
        alibi_slopes, part_m, part_l, part_acc, counts, scale, sliding_window or 0, float(logit_softcap or 1.0),
        *kv_cache_scales(kv_cache), *inverse_scales(kv_cache),
        q.stride(0), q.stride(1), _stride(k, 0), _stride(k, 1), _stride(v, 0), _stride(v, 1), _stride(cos, 0),
        out.stride(0), out.stride(1), kc.stride(0), kc.stride(1), kc.stride(2), meta.block_tables.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=max(16, triton.next_power_of_2(group)), BLOCK_N=DECODE_BLOCK_N, PAGE=meta.block_size,
        NUM_SPLITS=splits, USE_WINDOW=bool(sliding_window), ROTARY=cos is not None, WRITE=k is not None,
        ALIBI=alibi_slopes is not None, SOFTCAP=logit_softcap is not None, IEEE=q.dtype == torch.float32,
        FP8=is_fp8_cache(kv_cache),
    )


def _paged_launch(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, out: torch.Tensor, scale: float,
                  sliding_window: Optional[int], alibi_slopes: Optional[torch.Tensor], logit_softcap: Optional[float],
                  block_n: Optional[int] = None, **launch) -> None:
    """_paged_attn_kernel over the batch (launch: num_warps / num_stages, Triton's defaults unless
    given; decode_attn_probe.py sweeps them with block_n; by default 64 keys a tile, 128 for the
    single-token rows over an fp8 cache, FP8_DECODE_BLOCK_N). Prompts take tiles of 64 query rows,
    single-token rows the smallest tile (16 rows, or the GQA group). A batch of both (a prompt
    joining a decode batch, a fifth of serving's steps) launches twice, each launch skipping the
    other kind's sequences: one launch of 64-row tiles for all (7B, 96 decodes at ~290 tokens and a
    400-token prompt, H100) took 8.14 ms of attention a step, the two 7.14 ms (decodes alone: 5.32).
    The batch's metadata lists the prompts (prompt_seqs, set for batches of both kinds), so the
    second launch's programs cover only them, not every sequence times the longest prompt's tiles
    (97 x 32 x 7 programs for one 400-token prompt, all but 224 exiting at once)."""
    num_heads, num_kv_heads = q.shape[1], kv_cache.shape[3]
    group = num_heads // num_kv_heads
    small = max(16, triton.next_power_of_2(group))
    if meta.prompt_seqs is not None:
        launches = [(small, 1, None), (max(small, 64), 2, meta.prompt_seqs)]
    elif meta.max_query_len == 1:
        launches = [(small, 0, None)]
    else:  # prompts only (or a mixed batch whose metadata lists none: correct, in 64-row tiles)
        launches = [(max(small, 64), 0, None)]
    single = single_row_block_n(is_fp8_cache(kv_cache), q.dtype == torch.float32, q.shape[2])
    for block_m, rows, seq_map in launches:
        keys = block_n or (single if rows != 2 and block_m == small else 64)
        _paged_tiles(q, kv_cache, meta, out, scale, sliding_window, alibi_slopes, logit_softcap, keys, block_m,
                     rows, seq_map, **launch)


def _paged_tiles(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, out: torch.Tensor, scale: float,
                 sliding_window: Optional[int], alibi_slopes: Optional[torch.Tensor], logit_softcap: Optional[float],
                 block_n: int, block_m: int, rows: int, seq_map: Optional[torch.Tensor] = None, **launch) -> None:
    """One launch of _paged_attn_kernel: tiles of block_m rows; rows 0 all sequences, 1 those of
    one query token, 2 those of several; over the sequences seq_map lists when given."""
    num_heads, num_kv_heads = q.shape[1], kv_cache.shape[3]
    group = num_heads // num_kv_heads
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    tiles = 1 if rows == 1 else triton.cdiv(meta.max_query_len, block_m // group)
    grid = (meta.seq_lens.shape[0] if seq_map is None else seq_map.shape[0], num_kv_heads, tiles)
    _paged_attn_kernel[grid](
        q, k_cache, v_cache, out, meta.block_tables, meta.seq_lens, meta.query_start_loc, seq_map, alibi_slopes,
        scale, sliding_window or 0, float(logit_softcap or 1.0), *kv_cache_scales(kv_cache),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), meta.block_tables.stride(0),
        GROUP=group, HEAD_DIM=q.shape[2], BLOCK_D=max(16, triton.next_power_of_2(q.shape[2])),
        BLOCK_M=block_m, BLOCK_N=block_n, PAGE=meta.block_size, USE_WINDOW=bool(sliding_window),
        ALIBI=alibi_slopes is not None, SOFTCAP=logit_softcap is not None, IEEE=q.dtype == torch.float32,
        FP8=is_fp8_cache(kv_cache), ROWS=rows, MAPPED=seq_map is not None, **launch,
    )


def paged_attention_triton(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                           sliding_window: Optional[int] = None, alibi_slopes: Optional[torch.Tensor] = None,
                           logit_softcap: Optional[float] = None) -> torch.Tensor:
    """ops.attention.paged_attention's contract: the cache already holds this step's keys."""
    out = torch.empty_like(q)
    max_q = meta.max_query_len
    if q.shape[0] == 0 or max_q == 0:
        return out
    splits = decode_splits(meta.seq_lens.shape[0], kv_cache.shape[3]) if max_q == 1 else 1
    if splits > 1:
        _split_decode(q, None, None, None, None, kv_cache, meta, out, scale, sliding_window, alibi_slopes,
                      logit_softcap, splits)
        return out
    _paged_launch(q, kv_cache, meta, out, scale, sliding_window, alibi_slopes, logit_softcap)
    return out


def decode_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: Optional[torch.Tensor],
                            sin: Optional[torch.Tensor], kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                            sliding_window: Optional[int] = None, alibi_slopes: Optional[torch.Tensor] = None,
                            logit_softcap: Optional[float] = None) -> torch.Tensor:
    """A decode batch (at most one query token per sequence): rotary on q [T, Hq, D] and k [T, Hkv, D]
    by cos/sin [T, D] (none when cos is None), k and v stored at meta.slot_mapping, attention over
    each context; returns [T, Hq, D], contiguous. q, k, v: views with any token and head strides (of
    a fused qkv output), last dim contiguous. One launch for split batches; batches that fill the
    GPU unsplit take the KV write and the prefill kernel. Same cache bits either way."""
    num_seqs, num_kv_heads = meta.seq_lens.shape[0], k.shape[1]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.shape[0] == 0:
        return out
    splits = decode_splits(num_seqs, num_kv_heads)
    if splits == 1:
        if cos is None:
            write_kv_cache_triton(k, v, kv_cache, meta.slot_mapping)
        else:
            q = rotary_write_kv_triton(q, k, v, cos, sin, kv_cache, meta.slot_mapping)
        return paged_attention_triton(q, kv_cache, meta, scale, sliding_window, alibi_slopes, logit_softcap)
    _split_decode(q, k, v, cos, sin, kv_cache, meta, out, scale, sliding_window, alibi_slopes, logit_softcap, splits)
    return out
