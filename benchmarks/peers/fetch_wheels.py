"""Download a peer engine (vLLM, LMDeploy) and the requirements the GPU machine's image lacks, as
wheels for Python 3.12 / manylinux x86-64 (pack_parts.py then packs them into parts that fit one device call).

The GPU machine has no network and takes at most 64 MiB of carried files per call; its image
already holds torch 2.11 (CUDA 13) and ~200 packages (gpu_image_packages.txt, from the device
tool's KINDS.md). This walks the peer's Requires-Dist (markers evaluated for that machine, extras
followed when named), skips what the image has, downloads each wheel with `pip download
--no-deps` (manylinux 2_17 to 2_39 tags: some requirements ship only 2_31 builds) and writes
<out>/resolved.json: the wheels, and the versions the closure asks of what was skipped (to check
against the image). make_vllm_parts.sh and make_lmdeploy_parts.sh run it, then pack_parts.py;
the peer is the spec, what to leave out is --skip (each script's header says why).

    python benchmarks/peers/fetch_wheels.py vllm==0.25.1 --out .gpu/peers/cache/vllm --prune --skip ...
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64"] + [f"manylinux_2_{n}_x86_64" for n in range(24, 40)]
TARGET_ENV = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
              "platform_machine": "x86_64", "platform_system": "Linux", "sys_platform": "linux",
              "implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix"}


def image_packages() -> set[str]:
    return {canonicalize_name(line.strip()) for line in (HERE / "gpu_image_packages.txt").read_text().splitlines()
            if line.strip()}


def download(spec: str, dest: Path) -> Path:
    before = set(dest.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + ["--platform", "any", spec], check=True)
    new = set(dest.glob("*.whl")) - before
    name = canonicalize_name(Requirement(spec).name)
    for whl in new or dest.glob("*.whl"):
        if canonicalize_name(whl.name.split("-")[0]) == name:
            return whl
    raise RuntimeError(f"pip download {spec} left no wheel of {name} in {dest}")


def requirements(whl: Path, extras: set[str]) -> list[Requirement]:
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None or any(req.marker.evaluate({**TARGET_ENV, "extra": e}) for e in extras | {""}):
            out.append(req)
    return out


def resolve(root: str, dest: Path, skip: set[str], skipped: dict[str, set[str]],
            pins: dict[str, str] | None = None) -> list[dict]:
    """Download `root` and its requirements' closure minus `skip`; `skipped` collects the version
    specifiers asked of each skipped (image) package, to check against the image's versions.
    `pins` {name: requirement} replaces what the first asker says of that package. The walk takes
    the first requirement of each name, so conflicts() checks every asker afterwards."""
    seen: dict[str, dict] = {}
    queue = [(Requirement(root), set(Requirement(root).extras))]
    while queue:
        req, extras = queue.pop(0)
        name = canonicalize_name(req.name)
        if name in skip:
            skipped.setdefault(name, set()).add(str(req.specifier))
            continue
        if name in seen:
            continue
        spec = (pins or {}).get(name) or str(req).split(";")[0].strip()
        whl = download(spec, dest)
        seen[name] = {"name": name, "wheel": whl.name, "bytes": whl.stat().st_size,
                      "version": whl.name.split("-")[1], "requires": [str(r) for r in requirements(whl, extras)]}
        print(f"{whl.name} ({whl.stat().st_size / 2**20:.1f} MiB)", flush=True)
        for sub in requirements(whl, extras):
            queue.append((sub, set(sub.extras)))
    return list(seen.values())


def conflicts(wheels: list[dict]) -> list[str]:
    """Each requirement between the downloaded wheels that the chosen version does not satisfy
    (vLLM 0.25.1 pins apache-tvm-ffi==0.1.9 while the newest xgrammar asks >=0.1.11: that pair
    installed, and vLLM failed at import)."""
    versions = {w["name"]: w["version"] for w in wheels}
    out = []
    for w in wheels:
        for text in w["requires"]:
            req = Requirement(text)
            have = versions.get(canonicalize_name(req.name))
            if have is not None and req.specifier and not req.specifier.contains(have, prereleases=True):
                out.append(f"{w['name']} {w['version']} asks {req.name}{req.specifier}, the closure has {have}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", help="the peer, e.g. vllm==0.25.1")
    ap.add_argument("--out", required=True, type=Path, help="where the wheels and resolved.json go")
    ap.add_argument("--skip", nargs="*", default=[], help="more package names not to download")
    ap.add_argument("--pin", nargs="*", default=[], help="requirements that replace what the closure asks of "
                    "those packages, e.g. xgrammar==0.2.1")
    ap.add_argument("--prune", action="store_true",
                    help="remove wheels in --out that this resolution does not list (pack_parts.py packs them all)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    skip = image_packages() | {canonicalize_name(s) for s in args.skip}
    skipped: dict[str, set[str]] = {}
    pins = {canonicalize_name(Requirement(p).name): p for p in args.pin}
    wheels = resolve(args.spec, args.out, skip, skipped, pins)
    bad = conflicts(wheels)
    total = sum(w["bytes"] for w in wheels)
    asked = {name: sorted(s for s in specs if s) for name, specs in sorted(skipped.items())}
    resolved = {"spec": args.spec, "wheels": wheels, "total_bytes": total, "taken_from_the_image_or_skipped": asked}
    (args.out / "resolved.json").write_text(json.dumps(resolved, indent=1))
    if args.prune:
        keep = {w["wheel"] for w in wheels}
        for stale in sorted(p for p in args.out.glob("*.whl") if p.name not in keep):
            print(f"not in this resolution, removed from {args.out}: {stale.name}")
            stale.unlink()
    print(f"{len(wheels)} wheels, {total / 2**20:.0f} MiB in {args.out}")
    if bad:
        print("conflicting requirements (pin a version with --pin):\n  " + "\n  ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
