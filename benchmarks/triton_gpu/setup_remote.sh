#!/usr/bin/env bash
# On the GPU machine, from the repo root, with .gpu/triton (make_bundle.sh) carried there: unpack the
# bundle into $DEST, make a venv over this machine's Python in which numpy 1.26.4 comes first, and
# write $DEST/env.sh. Then: `. $DEST/env.sh && python3 benchmarks/gpu_serving.py ...`.
#
# Why a venv: tritonserver 2.51's Python stub crashes deserializing BYTES inputs under numpy 2, and
# the stub takes its environment from the first python3 on PATH (the launcher puts the running
# interpreter's bin first). The image's python3 is itself a venv
# (/opt/torch/.venv), and --system-site-packages reaches only the base interpreter's packages, so a
# .pth file adds that venv's site-packages after our own (torch, transformers stay visible; our
# numpy wins). A second .pth adds this checkout's src/: the 2.51 stub ignores PYTHONPATH (seen
# here), so that is how its models import tritongen. The server parts sit in $DEST/server in the nvidia-pytriton
# wheel's layout; env.sh points the launcher there (TRITONGEN_PYTRITON_DIR).
# pip installs, offline from the shipped wheels, only what is missing or does not fit.
# Idempotent: with the same bundle a second run only rewrites env.sh (about a second).
#   PYTHON=python3  BUNDLE=.gpu/triton/bundle.tar.xz  DEST=/tmp/tritongen-gpu
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
PY=${PYTHON:-python3}
BUNDLE=${BUNDLE:-.gpu/triton/bundle.tar.xz}
DEST=${DEST:-/tmp/tritongen-gpu}
V=$DEST/venv
log() { echo "[setup_remote $(date +%T)] $*"; }

[ -f "$BUNDLE" ] || { echo "no $BUNDLE: build it with benchmarks/triton_gpu/make_bundle.sh and carry .gpu/triton" >&2; exit 1; }
sum=$(cksum < "$BUNDLE")
if [ "$(cat "$DEST/.installed" 2>/dev/null)" != "$sum" ]; then
  log "unpacking $BUNDLE into $DEST"
  rm -rf "$DEST" && mkdir -p "$DEST"
  "$PY" - "$BUNDLE" "$DEST" <<'PY'
import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t:
    try:
        t.extractall(sys.argv[2], filter="tar")  # keeps the run bits
    except TypeError:  # Python < 3.11.4 has no filter
        t.extractall(sys.argv[2])
PY
  want=$(sed -n 's/^python=//p' "$DEST/MANIFEST")
  have=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [ "$want" = "$have" ] || { echo "the bundle is for Python $want, $PY is $have (PYVER=$have make_bundle.sh)" >&2; exit 1; }

  log "venv $V over $("$PY" -c 'import sys; print(sys.executable)')"
  "$PY" -m venv --without-pip --system-site-packages "$V"
  site=$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$PY" -c 'import site; print("\n".join(site.getsitepackages()))' > "$site/_tritongen_parent.pth"
  # scipy and scikit-learn in the image need numpy 2; transformers imports them when it finds them
  # (GenerationMixin -> sklearn). Hidden from the path finder, they count as not installed.
  cat > "$site/_tritongen_hide.py" <<'PY'
"""Packages built against numpy 2 are invisible in this numpy-1.26 venv (find_spec returns None)."""
import importlib.machinery
import sys

_HIDDEN = {"scipy", "sklearn"}


class _HidingPathFinder(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in _HIDDEN:
            return None
        return super().find_spec(name, path, target)


sys.meta_path[:] = [_HidingPathFinder if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
PY
  echo "import _tritongen_hide" > "$site/_tritongen_hide.pth"

  log "pip install (offline): $(tr '\n' ' ' < "$DEST/requirements.txt")"
  "$PY" -m pip --python "$V/bin/python" install -q --no-index --no-cache-dir --disable-pip-version-check \
    --find-links "$DEST/wheels" -r "$DEST/requirements.txt"
  "$V/bin/python" - <<'PY'
import importlib.metadata as md
import numpy
import tritonclient.grpc  # noqa: F401  (checks the grpcio and protobuf versions it was generated for)
import fastapi, uvicorn  # noqa: F401,E401
import torch, transformers  # noqa: F401,E401  (built against numpy 2; they must import with 1.26)
from transformers import AutoTokenizer, GenerationMixin  # noqa: F401,E401  (lazy: imports sklearn if visible)
assert numpy.__version__ == "1.26.4", numpy.__file__
print("venv ok:", ", ".join(f"{n} {md.version(n)}" for n in ("numpy", "torch", "tritonclient", "grpcio", "protobuf")))
PY
  # After pip, which would otherwise check tritongen's own requirements; sorts before the parent's.
  echo "$REPO/src" > "$site/_tritongen_0src.pth"
  echo "$sum" > "$DEST/.installed"
fi

{
  echo "export PATH=\"$V/bin:\$PATH\""
  echo "export PYTHONPATH=\"$REPO/src\${PYTHONPATH:+:\$PYTHONPATH}\""
  [ -d "$REPO/.gpu/tokcache" ] && echo "export TRITONGEN_CACHE=\"\${TRITONGEN_CACHE:-$REPO/.gpu/tokcache}\""
  echo "export TRITONGEN_PYTRITON_DIR=\"$DEST/server\""
  echo "export TRITONGEN_LLAMA2_TOKENIZER=\"$DEST/llama2-tokenizer\""
  echo "export PYTHONUNBUFFERED=1"
} > "$DEST/env.sh"
log "ready: . $DEST/env.sh   (python3 is now $V/bin/python3; /dev/shm: $(df -h /dev/shm | awk 'NR==2 {print $2 " total, " $4 " free"}'))"
