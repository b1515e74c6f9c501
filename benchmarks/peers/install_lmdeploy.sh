#!/usr/bin/env bash
# On the GPU machine, in the call that carries LMDeploy's part (one part: receiving and installing
# happen in the same call): receive, join, check and install the parts into $PEER_SITE
# (install_parts.sh), then check that lmdeploy imports with its PyTorch engine (TurboMind's
# libraries are stripped: lmdeploy.turbomind.is_available() is False) and generates a few tokens
# (lmdeploy_smoke.py: a tiny random Llama through lmdeploy.pipeline with PytorchEngineConfig).
#
#   bash benchmarks/peers/install_lmdeploy.sh [DIR]     # DIR default .gpu/peers/lmdeploy
#   then: export PYTHONPATH=/tmp/peer-site-lmdeploy:$PYTHONPATH   (printed at the end)
#
#   PEER_STASH=/tmp/peer-parts-lmdeploy  PEER_SITE=/tmp/peer-site-lmdeploy  PEER_SMOKE=1 (0: skip the generation)
# Its own site and stash, apart from vLLM's: the two carry different apache-tvm-ffi versions, and
# receive_part.sh clears a stash that holds another build's parts.
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=${1:-.gpu/peers/lmdeploy}
STASH=${PEER_STASH:-/tmp/peer-parts-lmdeploy}
SITE=${PEER_SITE:-/tmp/peer-site-lmdeploy}
log() { echo "[install_lmdeploy $(date +%T)] $*"; }

status=$(bash benchmarks/peers/install_parts.sh "$SRC" "$SITE" "$STASH" | tail -1)
case "$status" in
  installed:*|already*) log "$status" ;;
  *) log "not installing yet: $status"; exit 0 ;;
esac

export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
python3 - <<'PY'
import importlib.metadata as md
import lmdeploy
from lmdeploy import turbomind
from lmdeploy.pytorch.engine import Engine  # noqa: F401  (the PyTorch engine's import path)

print(f"import lmdeploy ok: lmdeploy {lmdeploy.__version__} from {lmdeploy.__file__}; TurboMind available "
      f"{turbomind.is_available()} ({type(turbomind._import_error).__name__}); "
      + ", ".join(f"{n} {md.version(n)}" for n in ("torch", "transformers", "triton", "xgrammar", "peft")))
PY
if [ "${PEER_SMOKE:-1}" = 1 ]; then
  log "tiny generation (lmdeploy_smoke.py)"
  python3 benchmarks/peers/lmdeploy_smoke.py
fi
log "ready: export PYTHONPATH=$SITE\${PYTHONPATH:+:\$PYTHONPATH}"
