#!/usr/bin/env bash
# On the GPU machine, in the call that carries the last part (or any later call on the same warm
# machine): receive, join, check and install the parts into $PEER_SITE (install_parts.sh), then
# check that vLLM imports and generates a few tokens (vllm_smoke.py: a tiny random Llama, no tokenizer).
#
#   bash benchmarks/peers/install_vllm.sh [DIR]       # DIR default .gpu/peers/vllm
#   then: export PYTHONPATH=/tmp/peer-site:$PYTHONPATH   (printed at the end)
#
#   PEER_STASH=/tmp/peer-parts  PEER_SITE=/tmp/peer-site  PEER_SMOKE=1 (0: skip the generation)
# The site lives outside $OUT, so it lasts only while the machine stays warm; a call that finds it
# installed from the same archive says so and only repeats the checks. pip installs with --no-deps:
# the image's torch 2.11, transformers, numpy stay what they are (the manifest lists what vLLM asks
# of them).
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=${1:-.gpu/peers/vllm}
STASH=${PEER_STASH:-/tmp/peer-parts}
SITE=${PEER_SITE:-/tmp/peer-site}
log() { echo "[install_vllm $(date +%T)] $*"; }

status=$(bash benchmarks/peers/install_parts.sh "$SRC" "$SITE" "$STASH" | tail -1)
case "$status" in
  installed:*|already*) log "$status" ;;
  *) log "not installing yet: $status"; exit 0 ;;
esac

export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
python3 - <<'PY'
import importlib.metadata as md
import vllm
from vllm.vllm_flash_attn.flash_attn_interface import FA2_AVAILABLE, FA3_AVAILABLE
print(f"import vllm ok: vllm {vllm.__version__} from {vllm.__file__}; FA2 {FA2_AVAILABLE}, FA3 {FA3_AVAILABLE}; "
      + ", ".join(f"{n} {md.version(n)}" for n in ("torch", "transformers", "numpy", "triton")))
PY
if [ "${PEER_SMOKE:-1}" = 1 ]; then
  log "tiny generation (vllm_smoke.py)"
  python3 benchmarks/peers/vllm_smoke.py
fi
log "ready: export PYTHONPATH=$SITE\${PYTHONPATH:+:\$PYTHONPATH}"
