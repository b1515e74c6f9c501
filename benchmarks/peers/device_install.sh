#!/usr/bin/env bash
# On the GPU machine: collect the parts of a peer's wheels (benchmarks/peers/fetch_wheels.py) that
# successive device calls carry in .peer/, and install them once all have arrived.
#
#   bash benchmarks/peers/device_install.sh .peer/vllm      # each call: stash this call's parts
#
# Parts are stashed in /tmp/peer-parts (kept while the machine stays warm between calls); when the
# manifest's parts are all there they are joined, unpacked and installed with pip --no-index
# --no-deps into /tmp/peer-site. Prints "installed" then, else "waiting for N parts".
# Use the peer with PYTHONPATH=/tmp/peer-site.
set -euo pipefail
src=${1:?usage: device_install.sh DIR-with-manifest.json-and-parts}
stash=/tmp/peer-parts
site=/tmp/peer-site
mkdir -p "$stash"
cp "$src"/manifest.json "$stash"/
if [ -d "$src/parts" ]; then cp "$src"/parts/part-* "$stash"/ 2>/dev/null || true; fi
if [ -f "$site/.installed" ]; then echo installed; exit 0; fi
missing=$(python3 - "$stash" <<'EOF'
import json, os, sys
stash = sys.argv[1]
parts = json.load(open(os.path.join(stash, "manifest.json")))["parts"]
print(sum(not os.path.exists(os.path.join(stash, p)) for p in parts))
EOF
)
if [ "$missing" != "0" ]; then echo "waiting for $missing parts"; exit 0; fi
mkdir -p /tmp/peer-wheels
cat "$stash"/part-* | tar -xf - -C /tmp/peer-wheels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" /tmp/peer-wheels/*.whl
touch "$site/.installed"
echo installed
