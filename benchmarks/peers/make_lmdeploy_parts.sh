#!/usr/bin/env bash
# Here (PyPI reachable): download LMDeploy and the requirements the GPU machine's image lacks, for
# its PyTorch engine (TurboMind needs CUDA 12; the image has CUDA 13), and pack them into parts of
# at most 56 MiB (docs/bench.md, "Peers on the GPU machine"). Output: .gpu/peers/lmdeploy/partNN +
# MANIFEST.json (.gpu/ is ignored by git; never commit it); downloads stay in
# .gpu/peers/cache/lmdeploy. pack_parts.py strips TurboMind's libraries from the lmdeploy wheel.
#
#   bash benchmarks/peers/make_lmdeploy_parts.sh     LMDEPLOY=lmdeploy==0.18.0  PART_MIB=56  XZ_LEVEL=6
#
# Left out of the download (--skip below), each read off LMDeploy 0.18.0's sources:
#   nvidia-{cuda-runtime,cublas,curand,nccl}-cu12  CUDA 12 libraries for TurboMind (stripped)
#   ray        pytorch/engine/mp_engine imports ray_engine only for the "ray" executor; one GPU runs "uni"
#   rdkit      not imported by lmdeploy at all
#   tilelang   imported by the gated-delta-rule, sparse-index-topk and DeepSeek-V4 kernels only
#              (Qwen3-Next, DeepSeek V3.2/V4); a dense Llama never imports them
# Taken from the image, whatever the pin says (pip installs with --no-deps; resolved.json lists the
# versions asked): torch<=2.12.1, torchvision<=0.27.1, triton<=3.7.1, transformers (not 5.0-5.5.0,
# 5.7-5.9), and peft<=0.14.0: lmdeploy imports peft only to load LoRA adapters
# (pytorch/models/patch.py add_adapters, pytorch/check_env/adapter.py), which the suite never
# passes, so the image's newer peft stays and peft 0.14.0 is not carried.
# Carried although vLLM's site has another version: apache-tvm-ffi 0.1.11 (xgrammar 0.2.9 links
# libtvm_ffi.so, and the engine imports xgrammar at start: pytorch/engine/guided_process.py), so
# install_lmdeploy.sh installs into its own site, /tmp/peer-site-lmdeploy.
set -euo pipefail
cd "$(dirname "$0")/../.."
LMDEPLOY=${LMDEPLOY:-lmdeploy==0.18.0}
PART_MIB=${PART_MIB:-56}
XZ_LEVEL=${XZ_LEVEL:-6}
CACHE=.gpu/peers/cache/lmdeploy
OUT=.gpu/peers/lmdeploy
SKIP=(nvidia-cuda-runtime-cu12 nvidia-cublas-cu12 nvidia-curand-cu12 nvidia-nccl-cu12 ray rdkit tilelang)
log() { echo "[make_lmdeploy_parts $(date +%T)] $*"; }

log "resolving and downloading $LMDEPLOY (cached in $CACHE)"
python3 benchmarks/peers/fetch_wheels.py "$LMDEPLOY" --out "$CACHE" --prune --skip "${SKIP[@]}" 2>&1 \
  | grep -v "^WARNING: Location"
log "packing into $OUT (xz -$XZ_LEVEL, parts of <= $PART_MIB MiB)"
python3 benchmarks/peers/pack_parts.py --wheels "$CACHE" --out "$OUT" --spec "$LMDEPLOY" --part-mib "$PART_MIB" \
  --xz-level "$XZ_LEVEL"
# Check the parts as the device will use them, without its Python: install them offline into a
# scratch --target for CPython 3.12 / manylinux, then read (not import) what the PyTorch engine's
# and the server's modules import: nothing of the stripped TurboMind library outside a try block,
# and nothing that is neither in the site, nor in the image, nor the standard library.
check=$(mktemp -d /tmp/lmdeploy-check.XXXXXX)
trap 'rm -rf "$check"' EXIT
PIP_TARGET_ARGS="--python-version 3.12 --implementation cp --abi cp312 --only-binary=:all: --platform any
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64" \
  PYTHON=python3 bash benchmarks/peers/install_parts.sh "$OUT" "$check/site" "$check/stash" > /dev/null
python3 benchmarks/peers/check_site_imports.py "$check/site" --forbid lmdeploy.turbomind._turbomind \
  --roots lmdeploy lmdeploy.pipeline lmdeploy.pytorch.engine.engine lmdeploy.pytorch.engine.model_agent.agent \
  lmdeploy.pytorch.models.llama lmdeploy.pytorch.backends.cuda.op_backend lmdeploy.serve.openai.api_server \
  lmdeploy.cli.entrypoint
log "carry $OUT/MANIFEST.json with $(python3 -c 'import json, sys; print(" ".join(p["name"] for p in json.load(open(sys.argv[1]))["parts"]))' "$OUT/MANIFEST.json"), then run install_lmdeploy.sh there"
