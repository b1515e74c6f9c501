"""Mixture-of-Experts on the GPU: the fused MoE kernel, batch-1 decode and offline sharegpt-like
throughput, each against its floor and beside a peer measured in the same job; prints a table and
writes JSON ($OUT/moe_suite.json, else out/moe_suite.json).

    PYTHONPATH=$PWD/src TRITONGEN_CACHE=<tokenizer cache> python3 benchmarks/moe_suite.py \
        --model dummy:mixtral-8x7b [--num-prompts 300] [--peer-subset 24] [--sections kernel,bs1,offline]
    PYTHONPATH=src python benchmarks/moe_suite.py --smoke    # CPU, dummy:tiny-mixtral, tiny sizes

Sections and peers:
  kernel   ops/triton_moe.fused_experts on one layer of the model's expert shapes at several token
           counts; peer: the reference loop over experts (ops/moe.fused_experts_ref, cuBLAS GEMMs)
  bs1      decode 128 in / 256 out at batch 1; peer: HF generate on the same weights
  offline  sharegpt-like through LLM.generate; peer: HF continuous batching on the first
           --peer-subset requests (ours again on those, for the ratio)
Floors follow bench/roofline.py's method with the bytes an MoE step reads: attention, norms and
router of every layer, the routed experts (batch 1: exactly top-k per MoE layer; a batch of B
tokens: E * (1 - (1 - k/E)^B) distinct experts expected under uniform routing), lm_head (the
embedding is gathered, not read), the KV context; over the copy bandwidth measured in this run.
The dataset floor walks the decode steps with their batch sizes (at most max_num_seqs running,
the tail of long requests at small batches reading few experts); prefill is counted compute-bound
on the active parameters at the measured bf16 GEMM rate.
The HF peer holds our engine's tensors (HF's class built on the meta device, load_state_dict with
assign=True): a second copy of 8x7B's 93 GB would not fit beside the first. It uses HF's default
experts implementation (grouped_mm where torch has it).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from tritongen.bench.gpu_suite_common import copy_bandwidth, free_memory, gemm_flops, seconds_per_call  # noqa: E402
from tritongen.models.arch import ModelArch  # noqa: E402

T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


# -- floors ---------------------------------------------------------------------------------------

def _layer_params(arch: ModelArch) -> tuple[int, int, int]:
    """(attention + norms + router params of one layer, one expert's params, a dense MLP's params)."""
    h, d = arch.hidden_size, arch.head_dim
    q, kv = arch.num_attention_heads * d, arch.num_key_value_heads * d
    attn = 2 * h * q + 2 * h * kv + 2 * h + (2 * d if arch.qk_norm else 0)
    return attn, 3 * h * arch.moe_intermediate_size, 3 * h * arch.intermediate_size


def distinct_experts(arch: ModelArch, tokens: float) -> float:
    e, k = arch.num_experts, arch.num_experts_per_tok
    return float(k) if tokens <= 1 else e * (1.0 - (1.0 - k / e) ** tokens)


def step_params_read(arch: ModelArch, tokens: float) -> float:
    """Parameters a step of `tokens` tokens reads: every layer's attention, the experts routed to."""
    attn, expert, dense = _layer_params(arch)
    total = arch.hidden_size + arch.vocab_size * arch.hidden_size  # final norm, lm_head
    for i in range(arch.num_hidden_layers):
        moe = arch.is_moe_layer(i)
        total += attn + (arch.num_experts * arch.hidden_size + distinct_experts(arch, tokens) * expert if moe
                         else dense)
    return total


def active_params(arch: ModelArch) -> float:
    """Parameters one token multiplies by (its top-k experts only)."""
    return step_params_read(arch, 1)


def kv_bytes_per_token(arch: ModelArch, elt: int) -> int:
    return 2 * arch.num_hidden_layers * arch.num_key_value_heads * arch.head_dim * elt


def decode_floor_s(arch: ModelArch, elt: int, context: int, bw: float) -> float:
    return (step_params_read(arch, 1) * elt + context * kv_bytes_per_token(arch, elt)) / bw


def dataset_floor_s(arch: ModelArch, elt: int, pairs: list[tuple[int, int]], max_batch: int,
                    bw: float, flops: float) -> dict:
    """bench.roofline.dataset_floor with MoE bytes, step by step: requests decode in arrival order,
    at most max_batch at once (a finished one's slot goes to the next), and each decode step reads
    the experts its batch is expected to route to, plus every running sequence's KV context."""
    act = active_params(arch)
    prefill_s = sum(2.0 * act * p for p, _ in pairs) / flops
    waiting = [[p, o - 1] for p, o in reversed(pairs) if o > 1]  # [context, decode steps left]
    running: list[list[int]] = []
    steps, decode_bytes, decode_tokens = 0, 0.0, 0
    while waiting or running:
        while waiting and len(running) < max_batch:
            running.append(waiting.pop())
        b = len(running)
        steps += 1
        decode_tokens += b
        decode_bytes += step_params_read(arch, b) * elt + sum(c + 1 for c, _ in running) * kv_bytes_per_token(arch, elt)
        for r in running:
            r[0] += 1
            r[1] -= 1
        running = [r for r in running if r[1] > 0]
    decode_s = max(decode_bytes / bw, 2.0 * act * decode_tokens / flops)
    return {"prefill_s": prefill_s, "decode_s": decode_s, "floor_s": prefill_s + decode_s, "decode_steps": steps,
            "mean_decode_batch": decode_tokens / steps if steps else 0}


# -- sections -------------------------------------------------------------------------------------

def section_kernel(args, arch: ModelArch, hw: dict) -> list[dict]:
    from tritongen.ops import moe, triton_moe

    dev, dtype = torch.device(args.device), getattr(torch, args.dtype)
    e, h, i, k = arch.num_experts, arch.hidden_size, arch.moe_intermediate_size, arch.num_experts_per_tok
    g = torch.Generator(device=dev).manual_seed(0)
    w13 = torch.randn(e, 2 * i, h, device=dev, dtype=dtype, generator=g) * h ** -0.5
    w2 = torch.randn(e, h, i, device=dev, dtype=dtype, generator=g) * i ** -0.5
    gate = torch.randn(e, h, device=dev, dtype=dtype, generator=g) * h ** -0.5
    rows = []
    for tokens in args.kernel_tokens:
        x = torch.randn(tokens, h, device=dev, dtype=dtype, generator=g)
        weights, ids = moe.select_experts(x @ gate.t(), k, arch.norm_topk_prob)
        read = int(torch.unique(ids).numel()) * 3 * h * i * w13.element_size()
        ours_fn = (lambda: triton_moe.fused_experts(x, w13, w2, weights, ids)) if dev.type == "cuda" else None
        ref_fn = lambda: moe.fused_experts_ref(x, w13, w2, weights, ids)  # noqa: E731
        ours = seconds_per_call(ours_fn, dev, args.kernel_iters, warmup=3) if ours_fn else None
        ref = seconds_per_call(ref_fn, dev, max(2, args.kernel_iters // 5), warmup=1)
        err = None
        if ours_fn:
            err = float((ours_fn().float() - ref_fn().float()).abs().max())
        floor = max(read / hw["bandwidth"], 2.0 * 3 * h * i * k * tokens / hw["flops"])
        row = {"tokens": tokens, "experts_read_bytes": read, "ours_us": ours and ours * 1e6, "ref_loop_us": ref * 1e6,
               "floor_us": floor * 1e6, "fraction": ours and floor / ours, "speedup_vs_loop": ours and ref / ours,
               "max_abs_err_vs_ref": err}
        log(f"kernel T={tokens}: ours {_f(row['ours_us'])} us, loop {ref * 1e6:.1f} us, floor {floor * 1e6:.1f} us "
            f"-> fraction {_f(row['fraction'])}, max |ours-ref| {_f(err)}")
        rows.append(row)
    del w13, w2
    free_memory()
    return rows


def _engine(args):
    from tritongen import LLM

    log(f"loading our engine {args.model} ({args.dtype}, {args.device})")
    kw = {"kv_cache_memory_gb": 0.05} if args.smoke else {}
    llm = LLM(args.model, device=args.device, dtype=args.dtype, enable_prefix_caching=False, **kw)
    log(f"engine ready: {llm.engine.runner.num_blocks} KV blocks, "
        f"{torch.cuda.memory_allocated() / 1e9 if torch.cuda.is_available() else 0:.1f} GB allocated")
    return llm


def ours_bs1(args, llm, arch: ModelArch, hw: dict, elt: int) -> dict:
    from tritongen.bench.offline import run_latency

    lat = run_latency(llm, 1, args.input_len, args.output_len, iters=1, warmup_iters=1)
    step_ms = lat["decode_step_ms"]["mean"]
    floor = decode_floor_s(arch, elt, args.input_len + args.output_len // 2, hw["bandwidth"])
    res = {**lat, "floor_ms": floor * 1e3, "fraction": floor * 1e3 / step_ms,
           "bytes_per_step": step_params_read(arch, 1) * elt}
    log(f"bs1 ours: {step_ms:.3f} ms/step ({1e3 / step_ms:.1f} tok/s), floor {floor * 1e3:.3f} ms "
        f"-> fraction {res['fraction']:.3f}")
    return res


def ours_offline(args, llm, arch: ModelArch, hw: dict, elt: int) -> tuple[dict, list]:
    from tritongen.bench.datasets import BenchRequest, load_dataset
    from tritongen.bench.offline import model_prompts, run_offline

    reqs = load_dataset("sharegpt-like", args.num_prompts, 0, llm.tokenizer)
    reqs = [BenchRequest(ids[:args.clip_prompt or None], len(ids[:args.clip_prompt or None]),
                         min(r.output_len, args.clip_output or r.output_len))
            for ids, r in zip(model_prompts(llm, reqs), reqs)]
    subset = reqs[:args.peer_subset]
    full = run_offline(llm, reqs)
    sub = run_offline(llm, subset, warmup=False)
    max_batch = llm.config.scheduler.max_num_seqs
    fl = dataset_floor_s(arch, elt, [(r.prompt_len, r.output_len) for r in reqs], max_batch, hw["bandwidth"],
                         hw["flops"])
    res = {"ours": full, "ours_subset": sub, "floor": fl, "fraction": fl["floor_s"] / full["elapsed_time"],
           "max_num_seqs": max_batch}
    log(f"offline ours: {full['output_tok_s']:.0f} out tok/s on {len(reqs)} requests (floor {fl['floor_s']:.2f} s "
        f"-> fraction {res['fraction']:.3f}); {sub['output_tok_s']:.0f} on the first {len(subset)}")
    return res, subset


def hf_on_our_weights(llm, dtype: torch.dtype):
    """HF's class holding our engine's tensors (no copy); our engine is shut down."""
    import transformers

    state, arch = llm.engine.runner.model.hf_state_dict(), llm.engine.runner.arch
    device = next(iter(state.values())).device
    llm.shutdown()
    d = arch.to_hf_config()
    config = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    hf.load_state_dict(state, strict=True, assign=True)
    hf.model.rotary_emb = type(hf.model.rotary_emb)(config=hf.config).to(device)  # computed on the CPU, as HF does
    meta = [n for n, b in hf.named_buffers() if b.is_meta]
    assert not meta, f"HF buffers left on the meta device: {meta}"
    return hf.eval()


def hf_peers(args, hf, subset) -> dict:
    from tritongen.bench.hf_bench import hf_latency, hf_throughput

    out: dict = {"experts_implementation": getattr(hf.config, "_experts_implementation", None)}
    if "bs1" in args.sections:
        log("bs1 HF generate")
        out["bs1"] = hf_latency(hf, args.input_len, args.output_len, iters=1)
        log(f"bs1 HF: {out['bs1']['tok_s']:.1f} tok/s")
    if "offline" in args.sections and subset:
        log(f"offline HF continuous batching on {len(subset)} requests")
        try:
            out["offline"] = hf_throughput(hf, subset, tokenizer=None, attn="paged|sdpa")
            out["offline"]["method"] = "transformers continuous batching, paged|sdpa"
        except Exception as exc:  # noqa: BLE001 - fall back to padded generate, recorded
            from tritongen.bench.gpu_suite_workloads import _padded_generate

            log(f"HF continuous batching failed ({exc!r}); padded batched generate instead")
            out["offline"] = _padded_generate(hf, subset)
            out["offline"]["method"] = f"padded generate, chunks of 16 (continuous batching failed: {exc!r})"[:200]
        log(f"offline HF: {out['offline']['output_tok_s']:.1f} out tok/s")
    return out


def _f(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def table(res: dict) -> str:
    lines = [f"{'measurement':<44} {'ours':>10} {'peer':>10} {'ours/peer':>9} {'roofline':>8}"]
    for r in res.get("kernel", []):
        lines.append(f"{'kernel T=' + str(r['tokens']) + ' (us; peer: loop)':<44} {_f(r['ours_us']):>10} "
                     f"{_f(r['ref_loop_us']):>10} {_f(r['speedup_vs_loop']):>9} {_f(r['fraction']):>8}")
    peer = res.get("hf", {})
    if "bs1" in res:
        o, p = res["bs1"], peer.get("bs1", {}).get("tok_s")
        tok_s = 1e3 / o["decode_step_ms"]["mean"]
        lines.append(f"{'bs1 decode tok/s (peer: HF generate)':<44} {tok_s:>10.1f} {_f(p):>10} "
                     f"{_f(p and tok_s / p):>9} {o['fraction']:>8.3f}")
    if "offline" in res:
        o, p = res["offline"], peer.get("offline", {}).get("output_tok_s")
        lines.append(f"{'offline out tok/s, ' + str(o['ours']['num_requests']) + ' req':<44} "
                     f"{o['ours']['output_tok_s']:>10.1f} {'':>10} {'':>9} {o['fraction']:>8.3f}")
        s = o["ours_subset"]["output_tok_s"]
        lines.append(f"{'offline out tok/s, ' + str(o['ours_subset']['num_requests']) + ' req (peer: HF CB)':<44} "
                     f"{s:>10.1f} {_f(p):>10} {_f(p and s / p):>9}")
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="dummy:mixtral-8x7b")
    ap.add_argument("--sections", default="kernel,bs1,offline")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--num-prompts", type=int, default=300)
    ap.add_argument("--peer-subset", type=int, default=24)
    ap.add_argument("--kernel-tokens", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 64, 256, 2048])
    ap.add_argument("--kernel-iters", type=int, default=20)
    ap.add_argument("--no-peer", dest="peer", action="store_false")
    ap.add_argument("--smoke", action="store_true", help="CPU, dummy:tiny-mixtral, float32, tiny sizes")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    args.clip_prompt = args.clip_output = None
    if args.smoke:
        args.model, args.device, args.dtype = "dummy:tiny-mixtral", "cpu", "float32"
        args.input_len, args.output_len, args.num_prompts, args.peer_subset = 16, 8, 8, 4
        args.kernel_tokens, args.kernel_iters, args.clip_prompt, args.clip_output = [1, 8], 2, 48, 8
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from tritongen.models.loader import read_arch

    arch = read_arch(args.model)
    elt = torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
    out_path = Path(args.json_out or Path(os.environ.get("OUT") or ROOT / "out") / "moe_suite.json")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if args.device == "cuda":
        hw = {"bandwidth": copy_bandwidth("cuda", 4 << 30), "flops": gemm_flops("cuda", 8192, "bfloat16")}
        free_memory()
    else:
        hw = {"bandwidth": 4.26e12, "flops": 795e12}
    res: dict = {"model": args.model, "hardware": hw, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "torch": torch.__version__, "args": {k: v for k, v in vars(args).items()}}
    log(f"copy bandwidth {hw['bandwidth'] / 1e12:.3f} TB/s, bf16 GEMM {hw['flops'] / 1e12:.0f} TFLOP/s; "
        f"{args.model}: {step_params_read(arch, 1) * elt / 1e9:.2f} GB read per bs1 step, "
        f"{active_params(arch) / 1e9:.2f}B active parameters")
    failed = False

    def guarded(name, fn):
        nonlocal failed
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - a failed section is a result; the rest still runs
            failed = True
            log(f"{name} FAILED: {exc!r}")
            traceback.print_exc()
            res[name + "_error"] = repr(exc)
            return None
        finally:
            out_path.write_text(json.dumps(res, indent=1, default=str))

    if "kernel" in args.sections:
        res["kernel"] = guarded("kernel", lambda: section_kernel(args, arch, hw)) or []
    subset = None
    if "bs1" in args.sections or "offline" in args.sections:
        llm = _engine(args)
        if "bs1" in args.sections:
            res["bs1"] = guarded("bs1", lambda: ours_bs1(args, llm, arch, hw, elt))
        if "offline" in args.sections:
            got = guarded("offline", lambda: ours_offline(args, llm, arch, hw, elt))
            if got:
                res["offline"], subset = got
        if args.peer:
            hf = guarded("hf_build", lambda: hf_on_our_weights(llm, getattr(torch, args.dtype)))
            del llm
            free_memory()
            if hf is not None:
                res["hf"] = guarded("hf", lambda: hf_peers(args, hf, subset)) or {}
    out_path.write_text(json.dumps(res, indent=1, default=str))
    print("\n" + table(res), flush=True)
    log(f"JSON: {out_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
