"""HF transformers generate at batch 1 on a random model of a preset's shape (the peer of
engine_throughput.py). Prints tokens/s.

    python benchmarks/hf_peer.py --preset llama-2-7b --input-len 128 --output-len 256
"""
from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    import transformers

    from tritongen.models.arch import ModelArch
    from tritongen.models.presets import PRESETS

    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama-2-7b")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--static-cache", action="store_true")
    args = ap.parse_args()
    d = ModelArch.from_hf_config(PRESETS[args.preset]).to_hf_config()
    config = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    with torch.device("cuda"):
        hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    ids = torch.randint(100, 30000, (1, args.input_len), device="cuda")
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    if args.static_cache:
        kw["cache_implementation"] = "static"
    hf.generate(ids, max_new_tokens=8, min_new_tokens=8, **kw)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    hf.generate(ids, max_new_tokens=args.output_len, min_new_tokens=args.output_len, **kw)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(f"HF generate {args.preset} bf16 bs1 {args.input_len}in/{args.output_len}out "
          f"static_cache={args.static_cache}: {args.output_len / dt:.1f} tok/s")


if __name__ == "__main__":
    main()
