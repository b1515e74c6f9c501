#!/usr/bin/env bash
# On the GPU machine, in the call that carries the last part (or any later call on the same warm
# machine): receive what this call carried (receive_part.sh), and once every part is present join
# them, check the archive's sha256, install the wheels offline into $PEER_SITE, then check that
# vLLM imports and generates a few tokens (vllm_smoke.py: a tiny random Llama, no tokenizer).
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

archive_sha=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["archive_sha256"])' "$SRC/MANIFEST.json")
if [ "$(cat "$SITE/.installed" 2>/dev/null)" = "$archive_sha" ]; then
  log "$SITE already holds this archive's install (the machine stayed warm since it was installed)"
else
  status=$(PEER_STASH=$STASH bash benchmarks/peers/receive_part.sh "$SRC" | tee /dev/stderr | tail -1)
  case "$status" in
    complete:*) ;;
    *) log "not installing yet: $status"; exit 0 ;;
  esac
  work=$(mktemp -d /tmp/peer-install.XXXXXX)
  trap 'rm -rf "$work"' EXIT
  log "joining the parts"
  cat "$STASH"/part[0-9][0-9] > "$work/wheels.tar.xz"
  got=$(sha256sum "$work/wheels.tar.xz" | cut -d' ' -f1)
  [ "$got" = "$archive_sha" ] || { echo "the joined archive's sha256 $got is not the manifest's $archive_sha" >&2; exit 1; }
  mkdir -p "$work/wheels"
  xz -d -T0 -c "$work/wheels.tar.xz" | tar -x -C "$work/wheels"
  rm -f "$work/wheels.tar.xz"
  log "pip install --no-index --no-deps --target $SITE ($(ls "$work/wheels" | wc -l) wheels)"
  rm -rf "$SITE"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
    --target "$SITE" "$work"/wheels/*.whl
  echo "$archive_sha" > "$SITE/.installed"
  log "installed into $SITE ($(du -sh "$SITE" | cut -f1))"
fi

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
