#!/usr/bin/env bash
# One device call: kernel + CUDA-path tests, then our engine vs HF generate on the 7B shape.
# Needs a tokenizer-only default-model cache in .gpu/tokcache (the device has no network).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TRITONGEN_CACHE=$PWD/.gpu/tokcache
python3 -m pytest tests/gpu -q -s -p no:cacheprovider -k "not default_model" 2>&1 | tail -15
python3 - <<'PY'
import torch, time
x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(10): y.copy_(x)
torch.cuda.synchronize(); print(f"copy bandwidth (read+write): {2 * 10 * x.numel() / (time.perf_counter() - t) / 1e12:.2f} TB/s")
PY
python3 benchmarks/engine_throughput.py --model dummy:llama-2-7b --device cuda --dtype bfloat16 --batches 1,32,128 --input-len 128 --output-len 256 2>&1 | grep -v Warn
python3 benchmarks/hf_peer.py --preset llama-2-7b --input-len 128 --output-len 256 2>&1 | tail -1
