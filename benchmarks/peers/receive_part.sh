#!/usr/bin/env bash
# On the GPU machine, once per device call: keep the part(s) of a peer's wheels that this call
# carried (pack_parts.py built them here as .gpu/peers/<peer>/partNN + MANIFEST.json), check every
# part's sha256 against the manifest, and report which parts are present and which are missing.
#
#   bash benchmarks/peers/receive_part.sh [DIR]       # DIR default .gpu/peers/vllm
#
# Parts are kept in $PEER_STASH (default /tmp/peer-parts), outside $OUT: they survive to the next
# call only while the machine stays warm (it is given back 30 s after a call ends). The script says
# what it found there, so a run that lost its machine in between shows it at once ("empty"), and
# it clears parts of another build (a manifest with another archive sha256).
# Exit status: 0 when the carried parts (if any) were good, 1 when one failed its check; the last
# line is "complete: N/N parts" or "missing: ...".
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=${1:-.gpu/peers/vllm}
STASH=${PEER_STASH:-/tmp/peer-parts}
[ -f "$SRC/MANIFEST.json" ] || { echo "no $SRC/MANIFEST.json: carry it with each part" >&2; exit 1; }
mkdir -p "$STASH"
python3 - "$SRC" "$STASH" <<'PY'
import hashlib, json, shutil, sys
from pathlib import Path

src, stash = Path(sys.argv[1]), Path(sys.argv[2])
manifest = json.loads((src / "MANIFEST.json").read_text())
parts = {p["name"]: p for p in manifest["parts"]}


def good(path: Path) -> bool:
    want = parts[path.name]
    if path.stat().st_size != want["bytes"]:
        return False
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest() == want["sha256"]


old = stash / "MANIFEST.json"
if old.exists() and json.loads(old.read_text())["archive_sha256"] != manifest["archive_sha256"]:
    for p in stash.glob("part*"):
        p.unlink()
    print(f"{stash} held parts of another build: cleared")
kept = sorted(p.name for p in stash.glob("part*") if p.name in parts and good(p))
for p in stash.glob("part*"):
    if p.name not in kept:
        p.unlink()  # damaged or foreign: it has to come again
print(f"{stash}: " + (f"{len(kept)} good parts from earlier calls (the machine stayed warm): {' '.join(kept)}"
                      if kept else "empty (a fresh machine, or the first call)"))
shutil.copy2(src / "MANIFEST.json", old)
failed = []
for p in sorted(src.glob("part*")):
    if p.name not in parts:
        failed.append(f"{p.name} (not in the manifest)")
    elif not good(p):
        failed.append(f"{p.name} (sha256 or size differs from the manifest)")
    elif p.name not in kept:
        shutil.copyfile(p, stash / p.name)
        print(f"received {p.name} ({p.stat().st_size / 2**20:.1f} MiB, sha256 ok)")
    else:
        print(f"{p.name} was already here")
have = sorted(p.name for p in stash.glob("part*"))
missing = [n for n in sorted(parts) if n not in have]
for f in failed:
    print(f"BAD PART {f}")
print(f"complete: {len(have)}/{len(parts)} parts" if not missing else
      f"missing: {' '.join(missing)} ({len(have)}/{len(parts)} present)")
sys.exit(1 if failed else 0)
PY
