#!/usr/bin/env bash
# On the GPU machine: receive what this call carried of a peer's parts (receive_part.sh), and once
# every part is present join them, check the archive's sha256 against the manifest and install the
# wheels offline into SITE (pip --no-index --no-deps: the image's torch, transformers, numpy stay
# what they are). install_vllm.sh and install_lmdeploy.sh run it, then check their peer.
#
#   bash benchmarks/peers/install_parts.sh DIR SITE STASH   # e.g. .gpu/peers/lmdeploy /tmp/peer-site-lmdeploy /tmp/peer-parts-lmdeploy
#
# The last line is "installed: SITE", "already installed: SITE" (SITE/.installed holds this
# archive's sha256: the machine stayed warm since) or "waiting: <receive_part.sh's status>";
# exit status 1 when a part or the joined archive fails its check. SITE and STASH live outside
# $OUT, so they last only while the machine stays warm.
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=$1
SITE=$2
STASH=$3
PYTHON=${PYTHON:-python3}
log() { echo "[install_parts $(date +%T)] $*" >&2; }

archive_sha=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["archive_sha256"])' "$SRC/MANIFEST.json")
if [ "$(cat "$SITE/.installed" 2>/dev/null)" = "$archive_sha" ]; then
  echo "already installed: $SITE"
  exit 0
fi
status=$(PEER_STASH=$STASH bash benchmarks/peers/receive_part.sh "$SRC" | tee /dev/stderr | tail -1)
case "$status" in
  complete:*) ;;
  *) echo "waiting: $status"; exit 0 ;;
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
log "pip install --no-index --no-deps --target $SITE ($(ls "$work/wheels" | wc -l) wheels) ${PIP_TARGET_ARGS:-}"
rm -rf "$SITE"
# PIP_TARGET_ARGS: e.g. "--python-version 3.12 --only-binary=:all: --platform ..." to check the install elsewhere
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
  ${PIP_TARGET_ARGS:-} --target "$SITE" "$work"/wheels/*.whl
echo "$archive_sha" > "$SITE/.installed"
log "installed into $SITE ($(du -sh "$SITE" | cut -f1))"
echo "installed: $SITE"
