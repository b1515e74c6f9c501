#!/usr/bin/env bash
# Build, on a machine with PyPI, the one-file bundle that lets the offline GPU machine run a real
# tritonserver and our servers (docs/bench.md, "Serving on the GPU machine"):
#   - tritonserver 2.51 from the nvidia-pytriton==0.7.0 wheel: the binary, the Python backend, the
#     backend stub of one Python version and the bundled libraries (not libpython3.13: the stub
#     links the running Python's libpython, and the server needs none);
#   - wheels for that Python: numpy==1.26.4 (the 2.51 stub cannot deserialize BYTES tensors with
#     numpy 2) and the closure of what our OpenAI server and the Triton bench client need
#     (fastapi, uvicorn, pydantic, prometheus-client, tritonclient[grpc]); setup_remote.sh installs
#     only those the machine lacks or has in a version that does not fit;
#   - a Llama-2 tokenizer (32000 ids, from the vocab-only GGUF in the llama-cpp-python sdist): the
#     default tokenizer's 49k ids do not fit the vocabulary of the dummy Llama-2 shapes.
# Wheels are re-zipped uncompressed so that xz compresses their contents (numpy: 18 MB -> 9 MB).
# Output: .gpu/triton/bundle.tar.xz (.gpu/ is ignored by git; never commit it). Downloads are kept in
# .gpu/cache, so a rebuild downloads nothing new. Usage: bash benchmarks/triton_gpu/make_bundle.sh
#   PYVER=3.12 (the GPU machine's Python)   OUT_DIR=.gpu/triton   MAX_MIB=56 (fail above this)
#   XZ_LEVEL=9 (1 builds a larger bundle in seconds, for trying setup_remote.sh here)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYVER=${PYVER:-3.12}
OUT_DIR=${OUT_DIR:-.gpu/triton}
MAX_MIB=${MAX_MIB:-56}
XZ_LEVEL=${XZ_LEVEL:-9}
CACHE=.gpu/cache
PYTRITON=nvidia-pytriton==0.7.0
LLAMA_CPP_SDIST=llama-cpp-python==0.3.36
# What setup_remote.sh asks pip for (offline, from the shipped wheels).
REQUIREMENTS=(numpy==1.26.4 "tritonclient[grpc]==2.73.0" "fastapi>=0.110" "uvicorn>=0.29" "pydantic>=2.6"
              "prometheus-client>=0.20")
PLATFORM=(--python-version "$PYVER" --implementation cp --only-binary=:all: --platform manylinux_2_28_x86_64
          --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
log() { echo "[make_bundle $(date +%T)] $*"; }

mkdir -p "$CACHE/wheels-$PYVER" "$OUT_DIR"
STAGE=$(mktemp -d /tmp/tritongen-bundle.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT

log "downloading (cached in $CACHE)"
ls "$CACHE"/nvidia_pytriton-0.7.0-*.whl >/dev/null 2>&1 ||
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --platform manylinux_2_35_x86_64 -d "$CACHE" "$PYTRITON"
python3 -m pip download -q "${PLATFORM[@]}" -d "$CACHE/wheels-$PYVER" "${REQUIREMENTS[@]}"

log "server: binary, Python backend, stub $PYVER, libraries"
mkdir -p "$STAGE/server"
unzip -q "$CACHE"/nvidia_pytriton-0.7.0-*.whl -d "$STAGE/server" 'pytriton/tritonserver/bin/*' \
  'pytriton/tritonserver/backends/*' "pytriton/tritonserver/python_backend_stubs/$PYVER/*" 'nvidia_pytriton.libs/*'
rm -f "$STAGE"/server/nvidia_pytriton.libs/libpython3*
find "$STAGE/server" -name __pycache__ -prune -exec rm -rf {} +
chmod +x "$STAGE/server/pytriton/tritonserver/bin/tritonserver" \
  "$STAGE/server/pytriton/tritonserver/python_backend_stubs/$PYVER/triton_python_backend_stub"
missing=$(LD_LIBRARY_PATH="$STAGE/server/nvidia_pytriton.libs" ldd "$STAGE/server/pytriton/tritonserver/bin/tritonserver" \
  "$STAGE/server/pytriton/tritonserver/backends/python/libtriton_python.so" | grep "not found" || true)
[ -z "$missing" ] || { echo "the server needs libraries the bundle lacks: $missing" >&2; exit 1; }

log "wheels for Python $PYVER (stored uncompressed)"
mkdir -p "$STAGE/wheels"
python3 - "$CACHE/wheels-$PYVER" "$STAGE/wheels" <<'PY'
import sys, zipfile
from pathlib import Path
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
for whl in sorted(src.glob("*.whl")):
    with zipfile.ZipFile(whl) as zin, zipfile.ZipFile(dst / whl.name, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            info.compress_type = zipfile.ZIP_STORED
            zout.writestr(info, data)
PY
printf '%s\n' "${REQUIREMENTS[@]}" > "$STAGE/requirements.txt"

log "Llama-2 tokenizer"
TOK="$CACHE/llama2-tokenizer"
if [ ! -f "$TOK/tokenizer.json" ]; then
  ls "$CACHE"/llama_cpp_python-0.3.36.tar.gz >/dev/null 2>&1 ||
    python3 -m pip download -q --no-deps --no-binary :all: -d "$CACHE" "$LLAMA_CPP_SDIST"
  GGUF_DIR=$(mktemp -d /tmp/tritongen-gguf.XXXXXX)
  tar -xzf "$CACHE/llama_cpp_python-0.3.36.tar.gz" -C "$GGUF_DIR" --strip-components 4 \
    llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf
  # tritongen's own conversion (`fetch-model --tokenizers` makes the same): EOS </s> (id 2; the
  # GGUF names <s>), BOS added, 32000 ids and a round trip of text checked. ~60 s: merges are rebuilt.
  PYTHONPATH=src python3 -c 'import sys; from pathlib import Path
from tritongen.preset_tokenizers import convert_vocab_gguf
convert_vocab_gguf(Path(sys.argv[1]), Path(sys.argv[2]), "llama-spm")' "$GGUF_DIR/ggml-vocab-llama-spm.gguf" "$TOK"
  rm -rf "$GGUF_DIR"
fi
cp -r "$TOK" "$STAGE/llama2-tokenizer"

cat > "$STAGE/MANIFEST" <<EOF
tritongen GPU bundle: $PYTRITON (server, stub $PYVER), wheels for cp${PYVER/./}, llama-2 tokenizer
python=$PYVER
built=$(date -u +%Y-%m-%dT%H:%M:%SZ)
EOF
(cd "$STAGE/wheels" && ls) >> "$STAGE/MANIFEST"

log "compressing (xz -$XZ_LEVEL; -9 takes a few minutes)"
rm -f "$OUT_DIR/bundle.tar.xz"
tar -C "$STAGE" -cf - MANIFEST requirements.txt server wheels llama2-tokenizer | xz "-$XZ_LEVEL" -T0 > "$OUT_DIR/bundle.tar.xz.part"
mv "$OUT_DIR/bundle.tar.xz.part" "$OUT_DIR/bundle.tar.xz"
bytes=$(stat -c %s "$OUT_DIR/bundle.tar.xz")
mib=$(python3 -c "print(f'{$bytes / 2**20:.1f}')")
log "$OUT_DIR/bundle.tar.xz: $mib MiB ($bytes bytes)"
if [ "$bytes" -gt $((MAX_MIB * 1024 * 1024)) ]; then
  echo "the bundle is over ${MAX_MIB} MiB: with .gpu/tokcache and the working tree it would not fit one 64 MiB carry" >&2
  exit 1
fi
