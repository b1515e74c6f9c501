"""Triton-language kernels for the paged KV cache: KV write and one attention kernel for prefill,
chunked prefill (extend over a cached prefix) and decode.

One program handles one sequence, one KV head and a tile of query rows. Rows pack
(query token, query head of the KV head's group), so GQA loads each KV tile once for the whole
group and decode still fills the tensor-core tile with the group's heads. Keys are walked in
tiles of BLOCK_N slots gathered through the block table, with an online softmax in float32.

Small decode batches (one query token per sequence, few sequences x KV heads) would leave most SMs
idle with one program per (sequence, KV head), so they split each context into NUM_SPLITS pieces
("flash-decoding"): one program per (sequence, KV head, split) writes a partial softmax state to
float32 scratch, and a second kernel combines the splits.

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

from tritongen.ops.attention import AttentionMetadata
from tritongen.ops.triton_elementwise import rope_row, rotate_heads


@triton.jit
def _write_kv_kernel(K, V, KC, VC, SLOTS, stride_kt, stride_kh, stride_vt, stride_vh, stride_cs, stride_ch,
                     NUM_HEADS: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(SLOTS + t)
    if slot >= 0:  # negative slots are padding rows (CUDA-graph batches)
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        ok = (d < HEAD_DIM) & (h < NUM_HEADS)
        dst = slot.to(tl.int64) * stride_cs + h * stride_ch + d
        # k and v may have different strides (v can be a view into a fused qkv output).
        tl.store(KC + dst, tl.load(K + t * stride_kt + h * stride_kh + d, mask=ok), mask=ok)
        tl.store(VC + dst, tl.load(V + t * stride_vt + h * stride_vh + d, mask=ok), mask=ok)


def write_kv_cache_triton(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    T, H, D = k.shape
    if T == 0:
        return
    kc, vc = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, H, D], contiguous slots
    _write_kv_kernel[(T,)](k, v, kc, vc, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                           kc.stride(1), kc.stride(2),
                           NUM_HEADS=H, BLOCK_H=triton.next_power_of_2(H), HEAD_DIM=D,
                           BLOCK_D=triton.next_power_of_2(D))


@triton.jit
def _rotary_write_kv_kernel(Q, K, V, COS, SIN, QO, KC, VC, SLOTS, stride_qt, stride_qh, stride_kt, stride_kh,
                            stride_vt, stride_vh, stride_c, stride_cs, stride_ch,
                            HQ: tl.constexpr, HK: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr,
                            BLOCK_HALF: tl.constexpr):
    t = tl.program_id(0)
    h, d, cos, sin = rope_row(COS, SIN, t, stride_c, BLOCK_H, HALF, BLOCK_HALF)
    # rotated q is contiguous [T, HQ, 2*HALF]
    rotate_heads(Q + t * stride_qt, QO + t * (HQ * 2 * HALF), cos, sin, stride_qh, 2 * HALF, h, d, HQ, HALF)
    slot = tl.load(SLOTS + t)
    if slot >= 0:  # negative slots are padding rows (CUDA-graph batches)
        dst = slot.to(tl.int64) * stride_cs
        rotate_heads(K + t * stride_kt, KC + dst, cos, sin, stride_kh, stride_ch, h, d, HK, HALF)
        ok = (h < HK) & (d < HALF)
        for half in tl.static_range(2):
            src = V + t * stride_vt + h * stride_vh + half * HALF + d
            tl.store(VC + dst + h * stride_ch + half * HALF + d, tl.load(src, mask=ok), mask=ok)


def rotary_write_kv_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """Rotary on q and k, and the KV-cache write of the rotated k and of v, in one launch (the
    rotated k never goes through memory on its own). Returns the rotated q, contiguous [T, Hq, D].
    Numerics as ops/triton_elementwise's rotary: float32, rounded once."""
    T, hq, d = q.shape
    hk = k.shape[1]
    qo = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if T:
        cos, sin = cos.contiguous(), sin.contiguous()
        kc, vc = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, H, D], contiguous slots
        _rotary_write_kv_kernel[(T,)](
            q, k, v, cos, sin, qo, kc, vc, slot_mapping, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            v.stride(0), v.stride(1), cos.stride(0), kc.stride(1), kc.stride(2),
            HQ=hq, HK=hk, BLOCK_H=triton.next_power_of_2(max(hq, hk)), HALF=d // 2,
            BLOCK_HALF=triton.next_power_of_2(d // 2))
    return qo


@triton.jit
def _attend_tile(q, K, V, BT, seq, kvh, n, n_ok, q_pos, window, d, d_ok, m_i, l_i, acc, scale,
                 stride_bt, stride_kb, stride_ks, stride_kh, PAGE: tl.constexpr, CAUSAL: tl.constexpr,
                 USE_WINDOW: tl.constexpr, IEEE: tl.constexpr):
    """One tile of BLOCK_N key slots (n, gathered through the block table) folded into the online
    softmax state (m_i, l_i, acc) of q's rows. Visible: slots n_ok; with CAUSAL only keys at or
    before each row's q_pos, and with USE_WINDOW only the last `window` of those."""
    blk = tl.load(BT + seq * stride_bt + n // PAGE, mask=n_ok, other=0)
    off = blk.to(tl.int64) * stride_kb + (n % PAGE) * stride_ks + kvh * stride_kh
    kv_mask = n_ok[:, None] & d_ok[None, :]
    k = tl.load(K + off[:, None] + d[None, :], mask=kv_mask, other=0.0)
    if IEEE:
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    else:
        qk = tl.dot(q, tl.trans(k)) * scale
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
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _paged_attn_kernel(
    Q, K, V, O, BT, SEQ_LENS, QSL, scale, window,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_kb, stride_ks, stride_kh, stride_bt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE: tl.constexpr, USE_WINDOW: tl.constexpr, IEEE: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    tile = tl.program_id(2)
    TOKS: tl.constexpr = BLOCK_M // GROUP
    q_start = tl.load(QSL + seq)
    q_len = tl.load(QSL + seq + 1) - q_start
    if tile * TOKS >= q_len:
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
                                     stride_bt, stride_kb, stride_ks, stride_kh, PAGE, True, USE_WINDOW, IEEE)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(O + (q_start + tok)[:, None].to(tl.int64) * stride_ot + head[:, None] * stride_oh + d[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


# Split-K decode. The split count depends only on the batch shape, never on context lengths: a
# decode step is captured in a CUDA graph per batch size and replayed with other context lengths.
SPLIT_BELOW_PROGRAMS = 128  # decode batches with fewer (sequence, KV head) programs than this split
SPLIT_TARGET_PROGRAMS = 2 * 132  # two waves of programs on the H200's 132 SMs
MAX_SPLITS = 16  # more pieces would only add reduce work; short contexts leave the extra ones empty
DECODE_BLOCK_N = 64


def decode_splits(num_seqs: int, num_kv_heads: int) -> int:
    """How many pieces each context of a decode batch is split into (a power of two; 1 = the
    unsplit kernel): the fewest that give SPLIT_TARGET_PROGRAMS programs, at most MAX_SPLITS."""
    programs = num_seqs * num_kv_heads
    if programs >= SPLIT_BELOW_PROGRAMS:
        return 1
    splits = 2
    while splits < MAX_SPLITS and programs * splits < SPLIT_TARGET_PROGRAMS:
        splits *= 2
    return splits


@triton.jit
def _decode_split_kernel(
    Q, K, V, PART_M, PART_L, PART_ACC, BT, SEQ_LENS, QSL, scale, window,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_bt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE: tl.constexpr, NUM_SPLITS: tl.constexpr, USE_WINDOW: tl.constexpr,
    IEEE: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(QSL + seq)
    if tl.load(QSL + seq + 1) == q_start:
        return  # no query token this step; the reduce kernel skips the sequence too
    seq_len = tl.load(SEQ_LENS + seq)  # the one query sits at seq_len - 1 and sees every key before it
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(seq_len - window, 0)
    # Whole BLOCK_N tiles per split, so short contexts leave the last splits empty, not tiny.
    base = lo // BLOCK_N * BLOCK_N
    chunk = tl.cdiv(tl.cdiv(seq_len - base, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = base + split * chunk
    end = tl.minimum(start + chunk, seq_len)
    r = tl.arange(0, BLOCK_M)  # rows: the GROUP query heads of this KV head, padded for tl.dot
    row_ok = r < GROUP
    head = kvh * GROUP + r
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q = tl.load(Q + q_start.to(tl.int64) * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for tile in range(start, end, BLOCK_N):  # no iterations for an empty split
        n = tile + tl.arange(0, BLOCK_N)
        n_ok = (n < end) & (n >= lo)
        # The window bounds `lo` (n_ok); every key up to the one query is visible.
        m_i, l_i, acc = _attend_tile(q, K, V, BT, seq, kvh, n, n_ok, seq_len, window, d, d_ok, m_i, l_i, acc,
                                     scale, stride_bt, stride_kb, stride_ks, stride_kh, PAGE, False, False, IEEE)
    # Scratch [num_seqs, num_heads, NUM_SPLITS(, HEAD_DIM)]; an empty split stores m=-inf, l=0, acc=0.
    part = (seq * tl.num_programs(1) * GROUP + head) * NUM_SPLITS + split
    tl.store(PART_M + part, m_i, mask=row_ok)
    tl.store(PART_L + part, l_i, mask=row_ok)
    tl.store(PART_ACC + part[:, None] * HEAD_DIM + d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _decode_reduce_kernel(PART_M, PART_L, PART_ACC, O, QSL, stride_ot, stride_oh,
                          HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    q_start = tl.load(QSL + seq)
    if tl.load(QSL + seq + 1) == q_start:
        return
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    part = (seq * tl.num_programs(1) + head) * NUM_SPLITS + tl.arange(0, NUM_SPLITS)
    m = tl.load(PART_M + part)
    l_part = tl.load(PART_L + part)
    acc = tl.load(PART_ACC + part[:, None] * HEAD_DIM + d[None, :], mask=d_ok[None, :], other=0.0)
    m_max = tl.max(m, 0)
    # Rescale every split to the common max; empty splits (m=-inf) weigh 0, and a context with
    # no visible key at all (every split empty) gives 0, not NaN.
    w = tl.exp(m - tl.where(m_max == float("-inf"), 0.0, m_max))
    l_sum = tl.sum(w * l_part, 0)
    out = tl.sum(w[:, None] * acc, 0) / tl.where(l_sum == 0.0, 1.0, l_sum)
    tl.store(O + q_start.to(tl.int64) * stride_ot + head * stride_oh + d, out.to(O.dtype.element_ty), mask=d_ok)


def _decode_split_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                            meta: AttentionMetadata, scale: float, sliding_window: Optional[int],
                            num_splits: int) -> None:
    """Decode (one query token per sequence) with each context split into num_splits pieces."""
    num_seqs = meta.seq_lens.shape[0]
    _, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    # Fresh scratch each call (a captured graph keeps it in its memory pool); every entry of a
    # sequence with a query token is written by the split kernel before the reduce reads it.
    part_ml = torch.empty(2, num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
    part_acc = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    block_d = max(16, triton.next_power_of_2(head_dim))
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, part_ml[0], part_ml[1], part_acc, meta.block_tables, meta.seq_lens,
        meta.query_start_loc, scale, sliding_window or 0,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        meta.block_tables.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=max(16, triton.next_power_of_2(group)),
        BLOCK_N=DECODE_BLOCK_N, PAGE=meta.block_size, NUM_SPLITS=num_splits,
        USE_WINDOW=bool(sliding_window), IEEE=q.dtype == torch.float32,
    )
    _decode_reduce_kernel[(num_seqs, num_heads)](
        part_ml[0], part_ml[1], part_acc, out, meta.query_start_loc, out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=block_d, NUM_SPLITS=num_splits,
    )


def paged_attention_triton(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                           sliding_window: Optional[int] = None) -> torch.Tensor:
    T, num_heads, head_dim = q.shape
    num_kv_heads = kv_cache.shape[3]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    max_q = meta.max_query_len
    if T == 0 or max_q == 0:
        return out
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    splits = decode_splits(meta.seq_lens.shape[0], num_kv_heads) if max_q == 1 else 1
    if splits > 1:
        _decode_split_attention(q, k_cache, v_cache, out, meta, scale, sliding_window, splits)
        return out
    block_m = max(16, triton.next_power_of_2(group))
    if max_q > 1:
        block_m = max(block_m, 64)
    toks = block_m // group
    grid = (meta.seq_lens.shape[0], num_kv_heads, triton.cdiv(max_q, toks))
    _paged_attn_kernel[grid](
        q, k_cache, v_cache, out, meta.block_tables, meta.seq_lens, meta.query_start_loc,
        scale, sliding_window or 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), meta.block_tables.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=block_m, BLOCK_N=64, PAGE=meta.block_size, USE_WINDOW=bool(sliding_window),
        IEEE=q.dtype == torch.float32,
    )
    return out
