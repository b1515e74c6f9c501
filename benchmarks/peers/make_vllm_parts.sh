#!/usr/bin/env bash
# Here (PyPI reachable): download vLLM and the requirements the GPU machine's image lacks, and pack
# them into parts of at most 56 MiB that one device call each can carry (docs/bench.md, "Peers on
# the GPU machine"). Output: .gpu/peers/vllm/partNN + MANIFEST.json (.gpu/ is ignored by git; never
# commit it); downloads stay in .gpu/peers/cache/vllm, so a rebuild downloads nothing new.
#
#   bash benchmarks/peers/make_vllm_parts.sh        VLLM=vllm==0.25.1  PART_MIB=56  XZ_LEVEL=6
#   KEEP_FA2=1: keep vLLM's FlashAttention-2 library (pack_parts.py says why it is stripped)
#
# Left out of the download (--skip below): packages vLLM imports only for other hardware, other
# attention/MoE backends, video input or its CLI's cloud commands. flashinfer-cubin (437 MiB of
# prebuilt FlashInfer kernels: on SM90 vLLM's attention default is its bundled FlashAttention-3,
# and greedy sampling never calls FlashInfer), the CUTLASS DSL / tilelang / tokenspeed / quack /
# humming kernel packs (~330 MiB: FA4, MLA and MoE paths), nvidia-cuda-nvcc / nvidia-nvvm (the
# image has nvcc), pynvvideocodec / torchcodec (video), z3-solver, fastapi-cloud-cli, sentry-sdk.
# Packages the image already has (gpu_image_packages.txt, from KINDS.md) are not downloaded
# either: torch 2.11.0, torchvision 0.26.0, torchaudio 2.11.0 are exactly what vLLM 0.25.1 pins.
# Measured on 2026-12-05: 85 wheels, 341.5 MiB downloaded -> 113.2 MiB of xz in 3 parts, the last
# 1.2 MiB (xz -6 took ~2 min on two cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
VLLM=${VLLM:-vllm==0.25.1}
PART_MIB=${PART_MIB:-56}
XZ_LEVEL=${XZ_LEVEL:-6}
CACHE=.gpu/peers/cache/vllm
OUT=.gpu/peers/vllm
SKIP=(flashinfer-cubin tokenspeed-triton tokenspeed-mla nvidia-cutlass-dsl nvidia-cutlass-dsl-libs-cu13
      nvidia-cutlass-dsl-libs-base nvidia-nvvm nvidia-cuda-nvcc tilelang pynvvideocodec z3-solver torchcodec
      humming-kernels quack-kernels fastapi-cloud-cli sentry-sdk)
# vLLM 0.25.1 pins apache-tvm-ffi==0.1.9; xgrammar (vLLM asks >=0.2.1) needs >=0.1.11 from 0.2.8 on,
# and the 0.2.9 that the walk took failed at `import vllm` (load_lib_module(extra_lib_paths=...)).
# 0.2.1 asks >=0.1.9. nvidia-cudnn-frontend 1.30+ asks apache-tvm-ffi>=0.1.11 too (1.28.0 only in an
# extra), and opentelemetry-sdk asks the api of its own release. fetch_wheels.py fails the build on
# any such conflict.
PINS=(xgrammar==0.2.1 nvidia-cudnn-frontend==1.28.0 opentelemetry-api==1.45.2)
log() { echo "[make_vllm_parts $(date +%T)] $*"; }

log "resolving and downloading $VLLM (cached in $CACHE)"
python3 benchmarks/peers/fetch_wheels.py "$VLLM" --out "$CACHE" --prune --pin "${PINS[@]}" --skip "${SKIP[@]}" 2>&1 | grep -v "^WARNING: Location"
log "packing into $OUT (xz -$XZ_LEVEL, parts of <= $PART_MIB MiB)"
python3 benchmarks/peers/pack_parts.py --wheels "$CACHE" --out "$OUT" --spec "$VLLM" --part-mib "$PART_MIB" \
  --xz-level "$XZ_LEVEL" ${KEEP_FA2:+--keep-fa2}
