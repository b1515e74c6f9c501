"""Compile every Triton kernel of tritongen for Hopper (sm_90) down to a cubin, without a GPU:
Triton's front end, its passes and the ptxas bundled with the triton wheel. Run as a script
(TRITON_INTERPRET must be unset when the kernels are defined); prints one line per kernel and
configuration and exits non-zero when one fails. tests/gpu/test_triton_compile.py runs it.

Shapes follow the models the engine serves: Llama-2-7B (32 heads, MHA), Llama-3-8B (32/8, GQA),
SmolLM2 (9/3, head_dim 64), Bloom-7B1 (32 heads, ALiBi, no rotary, LayerNorm over 4096; GPT-2's
over 768), Gemma-2-9B (16/8, head_dim 256, logit softcap); decode (BLOCK_M 16) and prefill
(BLOCK_M 64) attention tiles, the fused decode kernel at the largest split count (with and without
its KV write), every skinny GEMM candidate and every gated (gate/up + SiLU·mul) one.
The PTX of kernels whose last program reduces (split-K GEMMs, split fused decode) is checked for the
memory ordering they rely on, and the fused decode kernel's for the barrier after its KV write.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from tritongen.ops import triton_allreduce as tar  # noqa: E402
from tritongen.ops import triton_attention as ta  # noqa: E402
from tritongen.ops import triton_kv_write as tkw  # noqa: E402
from tritongen.ops import triton_elementwise as te  # noqa: E402
from tritongen.ops import triton_fp8 as tf8  # noqa: E402
from tritongen.ops import triton_fp8_quant as tfq  # noqa: E402
from tritongen.ops import triton_gemv as tg  # noqa: E402
from tritongen.ops.fp8 import Fp8Scales  # noqa: E402
from tritongen.ops import triton_lamport as tl_  # noqa: E402
from tritongen.ops import triton_moe as tm  # noqa: E402
from tritongen.ops import triton_qk_norm as tq  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
FLOAT_ARGS = {"eps", "scale", "softcap", "k_scale", "v_scale", "k_inv", "v_inv", "w_offset", "c0"}
INT64_ARGS = {"timeout_ns"}
INT_ARGS = {"N"}  # a size, though upper-case
# per kernel: upper-case sizes (K is a pointer elsewhere)
SIZES = {"_skinny_gemm_kernel": {"M", "N", "K", "K_PER_SPLIT"}, "_gated_gemm_kernel": {"M", "N", "K"},
         "_fp8_weight_gemm": {"M", "N", "K", "K_PER_SPLIT"}, "_fp8_tokens_gemm": {"M", "N", "K", "K_PER_SPLIT"},
         "_align_kernel": {"P", "E", "S"}, "_select_experts_kernel": {"E"}, "_sum_slots_kernel": {"H"}}
# per kernel: pointers of another type than the activations'
POINTER_TYPES = {"_fp8_weight_gemm": {"W": "*fp8e4nv", "S": "*fp32"},
                 "_fp8_tokens_gemm": {"XQ": "*fp8e4nv", "XS": "*fp32", "W": "*fp8e4nv", "S": "*fp32"},
                 "_quantize_tokens_kernel": {"Q": "*fp8e4nv", "S": "*fp32"},
                 "_rms_norm_kernel": {"Q": "*fp8e4nv", "QS": "*fp32"},
                 "_silu_mul_fp8_kernel": {"Q": "*fp8e4nv", "QS": "*fp32"},
                 "_add_rms_norm_kernel": {"Q": "*fp8e4nv", "QS": "*fp32"},
                 "_align_kernel": {"ids_ptr": "*i64", "sorted_ptr": "*i32", "block_expert_ptr": "*i32",
                                   "num_padded_ptr": "*i32"},
                 "_select_experts_kernel": {"logits_ptr": "*bf16", "weights_ptr": "*fp32", "ids_ptr": "*i64"},
                 "_sum_slots_kernel": {"y_ptr": "*bf16", "out_ptr": "*bf16"}}
# per kernel: its KV-cache pointers, float8 e4m3 in the FP8 (fp8 KV cache) configurations
FP8_CACHE_POINTERS = {"_paged_attn_kernel": {"K", "V"}, "_decode_attn_kernel": {"KC", "VC"},
                      "_write_kv_kernel": {"KC", "VC"}, "_rotary_write_kv_kernel": {"KC", "VC"}}
SHARED_MEMORY_LIMIT = 232448  # bytes per block on sm_90 (H100/H200), what the launch checks
FLOAT32_POINTERS = {"COS", "SIN", "PART_M", "PART_L", "PART_ACC", "PART", "SLOPES"}  # rope, split scratch, ALiBi
INT64_POINTERS = {"SLOTS", "BUF_PTRS", "FLAG_PTRS"}  # + symmetric-memory addresses
INT32_POINTERS = {"BT", "SEQ_LENS", "QSL", "SEQ_MAP", "COUNTS", "COUNT", "EPOCH"}
# kernels whose last program reduces the splits' partials -> the constexpr that counts the splits
LAST_PROGRAM_REDUCES = {"_skinny_gemm_kernel": "SPLIT_K", "_decode_attn_kernel": "NUM_SPLITS",
                        "_fp8_weight_gemm": "SPLIT_K", "_fp8_tokens_gemm": "SPLIT_K"}


def signature(kernel, dtype: str, constexprs: dict) -> dict:
    sig = {}
    for p in kernel.params:
        name = p.name
        if p.is_constexpr:
            sig[name] = "constexpr"
        elif constexprs.get("FP8") and name in FP8_CACHE_POINTERS.get(kernel.fn.__name__, ()):
            sig[name] = "*fp8e4nv"
        elif name in POINTER_TYPES.get(kernel.fn.__name__, {}):
            sig[name] = POINTER_TYPES[kernel.fn.__name__][name]
        elif name in INT_ARGS or name in SIZES.get(kernel.fn.__name__, ()):
            sig[name] = "i32"
        elif name in INT64_ARGS:
            sig[name] = "i64"
        elif name in FLOAT_ARGS:
            sig[name] = "fp32"
        elif name in FLOAT32_POINTERS:
            sig[name] = "*fp32"
        elif name in INT64_POINTERS:
            sig[name] = "*i64"
        elif name in INT32_POINTERS:
            sig[name] = "*i32"
        elif name.isupper():
            sig[name] = f"*{dtype}"
        else:  # strides, sizes, window
            sig[name] = "i32"
    missing = [p.name for p in kernel.params if p.is_constexpr and p.name not in constexprs]
    assert not missing, f"{kernel.fn.__name__}: no value for {missing}"
    return sig


def _attention_configs(dtype: str, hq: int, hk: int, d: int, window: bool = False, alibi: bool = False,
                       softcap: bool = False, fp8: bool = False) -> list[tuple]:
    """The prefill kernel's decode and prefill tiles (alone, the two launches of a mixed batch, the
    mapped prompt launch of a mixed step's graph) and the fused decode kernel at the most splits
    (RoPE families rotate and write; ALiBi ones write without rotary, or only read the cache);
    with `fp8`, over a float8 e4m3 KV cache."""
    out, group = [], hq // hk
    terms = dict(ALIBI=alibi, SOFTCAP=softcap, IEEE=dtype == "fp32", FP8=fp8)
    for use_window in (False, True) if window else (False,):
        small = max(16, triton.next_power_of_2(group))
        # alone; in a mixed batch; in a mixed step's CUDA graph (the prompts from SEQ_MAP)
        for block_m, rows, mapped in ((small, 0, False), (64, 0, False), (small, 1, False),
                                      (max(small, 64), 2, False), (max(small, 64), 2, True)):
            keys = ta.single_row_block_n(fp8, dtype == "fp32", d) if rows != 2 and block_m == small else 64
            out.append((ta._paged_attn_kernel, dtype, dict(
                GROUP=group, HEAD_DIM=d, BLOCK_D=max(16, d), BLOCK_M=block_m, BLOCK_N=keys, PAGE=16,
                USE_WINDOW=use_window, ROWS=rows, MAPPED=mapped, **terms)))
        for rotary, write in ((False, True), (False, False)) if alibi else ((True, True),):
            out.append((ta._decode_attn_kernel, dtype, dict(
                GROUP=group, HEAD_DIM=d, BLOCK_D=max(16, d), BLOCK_M=max(16, triton.next_power_of_2(group)),
                BLOCK_N=ta.DECODE_BLOCK_N, PAGE=16, NUM_SPLITS=ta.MAX_SPLITS, USE_WINDOW=use_window,
                ROTARY=rotary, WRITE=write, **terms)))
    return out


def configs() -> list[tuple]:
    """bf16 (what the engine serves in) for every shape; float32 (the GPU correctness tests) and
    the sliding window for one shape, to keep the CPU compile time of CI down."""
    out = []
    for dtype, shapes in (("bf16", ((32, 32, 128), (32, 8, 128), (9, 3, 64))), ("fp32", ((32, 8, 128),))):
        for hq, hk, d in shapes:
            bh, half = triton.next_power_of_2(max(hq, hk)), d // 2
            rope = dict(HQ=hq, HK=hk, BLOCK_H=bh, HALF=half, BLOCK_HALF=triton.next_power_of_2(half))
            out.append((te._rotary_kernel, dtype, rope))
            for fp8 in (False, True) if (hq, hk) == (32, 8) else (False,):  # fp8 KV cache: Llama-3-8B
                out.append((tkw._rotary_write_kv_kernel, dtype, dict(rope, FP8=fp8)))
                out.append((tkw._write_kv_kernel, dtype, dict(NUM_HEADS=hk, BLOCK_H=triton.next_power_of_2(hk),
                                                             HEAD_DIM=d, BLOCK_D=d, FP8=fp8)))
                out += _attention_configs(dtype, hq, hk, d, window=(hq, hk) == (32, 8), fp8=fp8)
        if dtype == "bf16":
            for fp8 in (False, True):
                out += _attention_configs(dtype, 32, 32, 128, alibi=True, fp8=fp8)  # Bloom-7B1
            out += _attention_configs(dtype, 16, 8, 256, softcap=True)  # Gemma-2-9B
        for hidden in (576, 4096) if dtype == "bf16" else (4096,):
            block = triton.next_power_of_2(hidden)
            for offset in (False, True):  # Llama's form, Gemma's
                for quant in (False, True) if dtype == "bf16" else (False,):  # output quantized for fp8
                    warps = dict(num_warps=te.wide_row_warps(block))
                    out.append((te._rms_norm_kernel, dtype, dict(BLOCK=block, OFFSET=offset, QUANT=quant), warps))
                    out.append((te._add_rms_norm_kernel, dtype, dict(BLOCK=block, OFFSET=offset, QUANT=quant), warps))
            out.append((te._norm_add_rms_norm_kernel, dtype, dict(BLOCK=block),  # Gemma's (1 + w) only
                        dict(num_warps=te.wide_row_warps(block))))
        for hidden in (768, 4096):  # GPT-2, Bloom-7B1
            for has_bias in (True, False) if hidden == 768 else (True,):
                block = triton.next_power_of_2(hidden)
                out.append((te._layer_norm_kernel, dtype, dict(BLOCK=block, HAS_BIAS=has_bias)))
                out.append((te._add_layer_norm_kernel, dtype, dict(BLOCK=block, HAS_BIAS=has_bias)))
        for rank, one_row in ((0, True), (1, False)) if dtype == "bf16" else ():  # TP=2, 13B hidden (5120 -> 8192)
            out.append((tar._allreduce_add_rms_norm_kernel, dtype,
                        dict(RANK=rank, WORLD=2, WORLD_POW2=2, NUM_SLOTS=tar.SLOTS, ONE_ROW=one_row, TIMEOUT=True,
                             BLOCK=8192),
                        dict(num_warps=8)))
            out.append((tl_._lamport_kernel, dtype, dict(RANK=rank, WORLD=2, WORLD_POW2=2, BITS=16, TIMEOUT=True,
                                                         BLOCK=8192), dict(num_warps=8)))
        out.append((te._silu_mul_kernel, dtype, dict(BLOCK=1024)))
        if dtype == "bf16":  # MoE alignment (no activations): Mixtral's 8 experts, Qwen3-MoE's 128
            for experts, block_m in ((8, 16), (8, 64), (128, 16), (128, 64)):
                out.append((tm._align_kernel, dtype,
                            dict(BLOCK_M=block_m, BLOCK_E=experts, CHUNK=min(64, max(16, 8192 // experts)))))
            for experts, top_k, renormalize in ((8, 2, True), (128, 8, True), (128, 8, False)):  # the routing
                out.append((tm._select_experts_kernel, dtype,
                            dict(TOP_K=top_k, BLOCK_E=experts, RENORMALIZE=renormalize)))
            for top_k, hidden in ((2, 4096), (8, 2048)):  # the experts' rows added per token
                out.append((tm._sum_slots_kernel, dtype, dict(TOP_K=top_k, BLOCK=min(1024, hidden))))
        if dtype == "bf16":  # quantized for an fp8 down_proj: 7B / 13B MLP widths, one program a row
            out.append((te._silu_mul_fp8_kernel, dtype, dict(BLOCK=16384), dict(num_warps=te.wide_row_warps(16384))))
        for gated in (False, True):  # GPT-2 / Bloom's GELU, Gemma's GeGLU
            out.append((te._gelu_tanh_kernel, dtype, dict(BLOCK=1024, GATED=gated)))
        for offset in (False, True):  # Qwen3-8B's qk-norm, Gemma 3's (1 + w)
            out.append((tq._qk_norm_kernel, dtype, dict(NUM_Q=32, HEAD_DIM=128, BLOCK_D=128, OFFSET=offset)))
        for c in tg.candidates(torch.bfloat16 if dtype == "bf16" else torch.float32):
            out.append((tg._skinny_gemm_kernel, dtype, dict(BLOCK_M=16, BLOCK_N=c["block_n"], BLOCK_K=c["block_k"],
                                                            SPLIT_K=c["split_k"], IEEE=dtype == "fp32"),
                        dict(num_warps=c["num_warps"], num_stages=c["num_stages"])))
        for c in tg.gated_candidates(torch.bfloat16 if dtype == "bf16" else torch.float32):
            out.append((tg._gated_gemm_kernel, dtype, dict(BLOCK_M=16, BLOCK_N=c["block_n"], BLOCK_K=c["block_k"],
                                                           IEEE=dtype == "fp32"),
                        dict(num_warps=c["num_warps"], num_stages=c["num_stages"])))
        if dtype == "bf16":
            out += _fp8_configs()
            for c in map(tfq.launch_config, (4096, 11008, 28672)):  # per-token fp8 quantization: one block, looped
                out.append((tfq._quantize_tokens_kernel, dtype, dict(BLOCK_K=c["BLOCK_K"], ONE_BLOCK=c["ONE_BLOCK"]),
                            dict(num_warps=c["num_warps"])))
    return out


def _fp8_configs() -> list[tuple]:
    """The FP8 kernels: the quantized-token one's candidates (per-channel and per-tensor scales),
    and the weight-only one's: every tiling candidate, decode and prefill row tiles (decode only
    for per-tensor scales, and for split-K: select_configs picks them for decode row buckets only),
    each scale layout (block: 128 x 128, the published checkpoints' size)."""
    out = []
    for kind, scales in (("channel", Fp8Scales("channel")), ("tensor", Fp8Scales("tensor")),
                         ("block", Fp8Scales("block", (128, 128)))):
        for c in tf8.candidates(scales):
            if c.get("QUANT"):  # decode rows only; bias as the layer has it
                out.append((tf8._fp8_tokens_gemm, "bf16", dict(
                    SCALE_KIND=tf8._KIND[kind], HAS_BIAS=kind == "channel", BLOCK_M=tf8.TOKEN_MAX_ROWS,
                    BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"], SPLIT_K=c["SPLIT_K"]), dict(num_warps=c["num_warps"])))
                continue
            for block_m in (16, 64) if kind != "tensor" and c["SPLIT_K"] == 1 else (16,):
                out.append((tf8._fp8_weight_gemm, "bf16", dict(
                    SCALE_KIND=tf8._KIND[kind], SCALE_BN=128 if kind == "block" else 1,
                    SCALE_BK=128 if kind == "block" else 1, HAS_BIAS=kind == "channel" and block_m == 16,
                    BLOCK_M=block_m, BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"], SPLIT_K=c["SPLIT_K"], IEEE=False),
                    dict(num_warps=c["num_warps"])))
    return out


def partials_published(ptx: str) -> bool:
    """A kernel whose last program reduces (the split-K skinny GEMM, the fused decode attention)
    publishes its partials in the order that reduction relies on: the last global store before the
    counter's atomic is followed by a CTA barrier (bar.sync), and the atomic is acq_rel at gpu scope."""
    atom = re.search(r"atom\.global\.(gpu\.acq_rel|acq_rel\.gpu)\.add", ptx)
    if atom is None:
        return False
    before = ptx[:atom.start()]
    return before.rfind("bar.sync") > before.rfind("st.global")


def kv_write_fenced(ptx: str) -> bool:
    """The fused decode kernel's KV write (its first global stores) is followed by a CTA barrier
    before any later global load: the split that stores the new key reads it back through the cache."""
    first = ptx.find("st.global")
    barrier = ptx.find("bar.sync", first)
    if first < 0 or barrier < 0:
        return False
    write = ptx[first:barrier]
    return re.search(r"ld\.global|cp\.async", write[write.rfind("st.global"):]) is None


def main() -> int:
    failed = 0
    for kernel, dtype, constexprs, *options in configs():
        opts = options[0] if options else {}
        label = f"{kernel.fn.__name__} {dtype} {constexprs}{' ' + str(opts) if opts else ''}"
        try:
            src = ASTSource(fn=kernel, signature=signature(kernel, dtype, constexprs), constexprs=constexprs)
            compiled = triton.compile(src, target=TARGET, options=opts)
            size, shared = len(compiled.asm["cubin"]), compiled.metadata.shared
            if shared > SHARED_MEMORY_LIMIT:  # compiles, but would fail at launch
                raise RuntimeError(f"needs {shared} bytes of shared memory, sm_90 has {SHARED_MEMORY_LIMIT}")
            splits = constexprs.get(LAST_PROGRAM_REDUCES.get(kernel.fn.__name__), 1)
            if splits > 1 and not partials_published(compiled.asm["ptx"]):
                raise RuntimeError("split partial stores not followed by bar.sync + atom.acq_rel.gpu in the PTX")
            if kernel is ta._decode_attn_kernel and constexprs["WRITE"] and not kv_write_fenced(compiled.asm["ptx"]):
                raise RuntimeError("KV write not followed by bar.sync before the key tiles are loaded")
            print(f"ok     {label}: cubin {size} bytes, shared {shared}", flush=True)
        except Exception as exc:  # noqa: BLE001 - report every kernel, then fail
            failed += 1
            print(f"FAILED {label}: {type(exc).__name__}: {str(exc)[:400]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
