"""`bench hf` (the HF transformers peer) and `bench roofline` (floors from the model shape)."""
from __future__ import annotations

import argparse

from tritongen.bench.cli_common import add_dataset_args, load_bench_tokenizer, write_json


def _torch_setup(args: argparse.Namespace):
    from tritongen.models.loader import read_arch
    from tritongen.runner.model_runner import resolve_device, resolve_dtype

    device = resolve_device(args.device)
    return device, resolve_dtype(args.dtype, device, read_arch(args.model).torch_dtype)


def cmd_hf(args: argparse.Namespace) -> int:
    from tritongen.bench.datasets import load_dataset
    from tritongen.bench.hf_bench import hf_latency, hf_throughput, load_hf_model
    from tritongen.bench.offline import format_offline

    device, dtype = _torch_setup(args)
    hf = load_hf_model(args.model, dtype, device, seed=args.seed)
    summary: dict = {"model": args.model, "dtype": str(dtype).replace("torch.", ""), "device": str(device)}
    if args.mode in ("latency", "both"):
        lat = hf_latency(hf, args.input_len, args.output_len, args.iters, args.seed)
        summary["latency"] = lat
        print(f"HF generate batch 1 ({args.input_len} in / {args.output_len} out): {lat['tok_s']:.1f} tok/s, "
              f"{lat['ms_per_token']:.2f} ms/token (prefill included)")
    if args.mode in ("throughput", "both"):
        requests = load_dataset(args.dataset, args.num_prompts, args.seed, load_bench_tokenizer(args, args.model),
                                args.corpus)
        thr = hf_throughput(hf, requests, load_bench_tokenizer(args, args.model), args.attn)
        summary["throughput"] = thr
        print(format_offline({"model": f"HF {args.attn} continuous batching", "dataset": args.dataset, **thr}))
    write_json(args.out, summary)
    return 0


def add_hf(sub) -> None:
    p = sub.add_parser("hf", help="the same model and dataset through HF transformers (the peer)")
    p.add_argument("--model", default="dummy:tiny-llama", help="HF directory or dummy:<preset> (same weights as ours)")
    p.add_argument("--dtype", default="auto", help="float32 | bfloat16 | float16 | auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--mode", choices=["latency", "throughput", "both"], default="both",
                   help="latency: generate at batch 1; throughput: the dataset through generate_batch's engine")
    p.add_argument("--input-len", type=int, default=128, help="latency mode prompt length")
    p.add_argument("--output-len", type=int, default=256, help="latency mode output length")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--attn", default="paged|sdpa", help="attention implementation for continuous batching")
    p.add_argument("--out", default=None, help="write the results as JSON")
    add_dataset_args(p)
    p.set_defaults(func=cmd_hf)


def cmd_roofline(args: argparse.Namespace) -> int:
    from tritongen.bench import roofline
    from tritongen.bench.datasets import sharegpt_like_lengths
    from tritongen.models.loader import read_arch

    arch = read_arch(args.model)
    hw = roofline.Hardware(bandwidth=args.bandwidth_tbs * 1e12, flops=args.tflops * 1e12)
    print(f"hardware: {args.bandwidth_tbs} TB/s, {args.tflops} TFLOP/s; model params "
          f"{roofline.total_params(arch) / 1e9:.3f} B")
    step = roofline.decode_step_floor(arch, args.dtype, [args.context_len] * args.batch_size, hw)
    print(roofline.format_step(args.model, args.dtype, step, args.measured_ms))
    if args.dataset:
        if args.dataset == "sharegpt-like":
            pairs = sharegpt_like_lengths(args.num_prompts, args.seed)
        elif args.dataset.startswith("random:"):
            _, i, o = args.dataset.split(":")
            pairs = [(int(i), int(o))] * args.num_prompts
        else:
            raise ValueError("roofline needs lengths only: use --dataset sharegpt-like or random:IN:OUT")
        ds = roofline.dataset_floor(arch, args.dtype, pairs, args.max_batch, hw)
        print(roofline.format_dataset(ds, args.measured_s))
    return 0


def add_roofline(sub) -> None:
    p = sub.add_parser("roofline", help="floor of a decode step and of a dataset from the model shape")
    p.add_argument("--model", default="dummy:llama-2-7b", help="HF directory or dummy:<preset> (config only)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--context-len", type=int, default=256, help="context of each sequence in the decode step")
    p.add_argument("--measured-ms", type=float, default=None, help="measured step time: prints the fraction")
    p.add_argument("--dataset", default=None, help="sharegpt-like | random:IN:OUT: also the dataset floor")
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-batch", type=int, default=128, help="most sequences per step (serving concurrency)")
    p.add_argument("--measured-s", type=float, default=None, help="measured dataset time: prints the fraction")
    p.add_argument("--bandwidth-tbs", type=float, default=4.26, help="memory bandwidth, TB/s (H200 copy)")
    p.add_argument("--tflops", type=float, default=795.0, help="peak TFLOP/s in dtype (H200 bf16 GEMM)")
    p.set_defaults(func=cmd_roofline)
