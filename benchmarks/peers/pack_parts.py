"""Pack downloaded wheels into parts that fit one device call each, with a manifest of sha256s.

Every wheel is rewritten uncompressed (ZIP_STORED) minus the files STRIP names for it, the
stored wheels go into one tar, xz compresses it (xz finds far more in CUDA kernel libraries than
a wheel's deflate: FlashAttention-3's 146 MiB library is 37 MiB in the wheel, 10 MiB in xz), and
the stream is cut into <out>/partNN of at most --part-mib MiB. <out>/MANIFEST.json holds each
part's sha256 and size, the whole archive's sha256, the wheels and what was stripped (and why).
On the device, receive_part.sh checks each part as it arrives and install_<peer>.sh joins them.

    python benchmarks/peers/pack_parts.py --wheels .gpu/peers/cache/vllm --out .gpu/peers/vllm --spec vllm==0.25.1
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from packaging.utils import canonicalize_name

# What importing the peer and generating with a dense Llama model in bf16 on an H200 (SM90) never
# loads; each pattern matches paths inside the wheel named by the key. vLLM's rules are read from
# vLLM 0.25.1's sources, LMDeploy's from LMDeploy 0.18.0's.
STRIP = {
    "vllm": {
        # FlashAttention-2 kernels. On SM90 vllm/v1/attention/backends/fa_utils.py picks FA3 (FA2 only
        # for ALiBi or where FA3 is not built); flash_attn_interface.py imports _vllm_fa2_C in a
        # try block (FA2_AVAILABLE), and the package needs only one of the two libraries.
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": "FA2 kernels: SM90 runs FA3; the import is optional",
        # MoE kernels: CudaPlatform.import_kernels imports them under contextlib.suppress(ImportError),
        # and only fused_moe layers call torch.ops._moe_C.
        "vllm/_moe_C_stable_libtorch.abi3.so": "MoE kernels: a dense Llama has no MoE layer; optional import",
        # The Rust frontend, used only with VLLM_USE_RUST_FRONTEND=1 (envs.py).
        "vllm/vllm-rs": "opt-in Rust frontend binary (VLLM_USE_RUST_FRONTEND=1 only)",
        # DeepGEMM's bindings built for the other Python versions (the device runs 3.12).
        "vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so": "DeepGEMM bindings of other Pythons (device: 3.12)",
    },
    "lmdeploy": {
        # TurboMind, LMDeploy's C++ engine, linked against CUDA 12 (libcudart.so.12, libcublas.so.12):
        # the device's CUDA 13 cannot load it. lmdeploy/turbomind/__init__.py imports it in a try block
        # (ImportError, OSError) and then is_available() is False; the PyTorch engine never needs it:
        # archs.autoget_backend_config returns at once for a PytorchEngineConfig, `lmdeploy serve
        # api_server --backend pytorch` skips autoget_backend, and pytorch/backends/cuda/awq_modules.py
        # asks for it only for AWQ weights. The package's Python files stay (they are what says
        # "not available").
        "lmdeploy/turbomind/_turbomind.cpython-*.so": "TurboMind (CUDA 12): optional import, unused by PyTorch",
        "lmdeploy/turbomind/lib/libturbomind_nccl_stub.so": "loaded by TurboMind only",
        # A static library, for building against TurboMind; nothing loads a .a at run time.
        "lmdeploy/turbomind/lib64/libxgrammar.a": "static library for builds; never loaded",
    },
    # xgrammar 0.2.1 (make_vllm_parts.sh pins it: the newest release that accepts vLLM 0.25.1's
    # apache-tvm-ffi 0.1.9) ships a 65 MB static library beside its bindings; 0.2.6 on do not.
    "xgrammar==0.2.1": {
        "xgrammar/lib/libxgrammar.a": "static library for builds; never loaded",
    },
}


def strip_rules(wheel: Path, keep_fa2: bool) -> dict[str, str]:
    name, version = canonicalize_name(wheel.name.split("-")[0]), wheel.name.split("-")[1]
    rules = {**STRIP.get(name, {}), **STRIP.get(f"{name}=={version}", {})}  # a package's rules, or one release's
    if keep_fa2:
        rules.pop("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", None)
    return rules


def rewrite_stored(src: Path, dst: Path, rules: dict[str, str]) -> list[str]:
    """Copy wheel `src` to `dst` uncompressed, without the files matching `rules` (their RECORD
    lines go too, so pip's record stays true). Returns the stripped paths."""
    stripped = []
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        names = zin.namelist()
        drop = {n for n in names for pat in rules if fnmatch.fnmatch(n, pat)}
        missing = [pat for pat in rules if not any(fnmatch.fnmatch(n, pat) for n in names)]
        if missing:  # a rule that matches nothing means the wheel changed: look again before trusting it
            raise SystemExit(f"{src.name}: strip rules match no file: {missing}")
        for info in zin.infolist():
            if info.filename in drop:
                stripped.append(info.filename)
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = "".join(line for line in data.decode().splitlines(keepends=True)
                               if line.split(",", 1)[0] not in drop).encode()
            info.compress_type = zipfile.ZIP_STORED
            zout.writestr(info, data)
    return stripped


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_peer_wheel(wheels: list[Path], spec: str) -> None:
    """The wheel of the peer that `spec` names must be there when it has strip rules: a rule that
    never meets its wheel would strip nothing and pass silently."""
    if not spec:
        return
    from packaging.requirements import Requirement

    peer = canonicalize_name(Requirement(spec).name)
    if peer in STRIP and not any(canonicalize_name(w.name.split("-")[0]) == peer for w in wheels):
        raise SystemExit(f"{spec}: no {peer} wheel among the {len(wheels)} wheels, so its strip rules match nothing")


def pack(wheels: list[Path], out: Path, part_mib: int, xz_level: str, keep_fa2: bool) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("part[0-9][0-9]"):
        old.unlink()
    listed, stripped = [], {}
    with tempfile.TemporaryDirectory(prefix="peer-pack-") as tmp:
        stage = Path(tmp) / "wheels"
        stage.mkdir()
        for whl in wheels:
            rules = strip_rules(whl, keep_fa2)
            gone = rewrite_stored(whl, stage / whl.name, rules)
            if gone:
                stripped[whl.name] = {"files": gone, "why": rules}
            listed.append({"wheel": whl.name, "download_bytes": whl.stat().st_size,
                           "stored_bytes": (stage / whl.name).stat().st_size})
        archive = Path(tmp) / "wheels.tar.xz"
        t0 = time.monotonic()
        tar = subprocess.Popen(["tar", "-C", str(stage), "-cf", "-", *sorted(w["wheel"] for w in listed)],
                               stdout=subprocess.PIPE)
        with open(archive, "wb") as f:
            subprocess.run(["xz", f"-{xz_level}", "-T0", "-c"], stdin=tar.stdout, stdout=f, check=True)
        if tar.wait() != 0:
            raise SystemExit("tar failed")
        print(f"xz -{xz_level}: {time.monotonic() - t0:.0f} s", flush=True)
        subprocess.run(["split", "-b", f"{part_mib}M", "-d", "-a", "2", str(archive), str(out / "part")], check=True)
        parts = [{"name": p.name, "bytes": p.stat().st_size, "sha256": sha256(p)} for p in sorted(out.glob("part*"))]
        return {"format": "tar of wheels stored uncompressed, xz-compressed, split; join: cat part* | xz -d | tar -x",
                "archive_sha256": sha256(archive), "archive_bytes": archive.stat().st_size, "parts": parts,
                "part_mib": part_mib, "wheels": listed, "stripped": stripped,
                "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheels", required=True, type=Path, help="directory of downloaded wheels (fetch_wheels.py)")
    ap.add_argument("--out", required=True, type=Path, help="where partNN and MANIFEST.json go")
    ap.add_argument("--spec", default="", help="the peer, recorded in the manifest: vllm==0.25.1, lmdeploy==0.18.0")
    ap.add_argument("--part-mib", type=int, default=56, help="a call carries 64 MiB with the working tree")
    ap.add_argument("--xz-level", default="6", help="xz preset (9 compresses a little more, slower)")
    ap.add_argument("--keep-fa2", action="store_true", help="keep vLLM's FlashAttention-2 library")
    args = ap.parse_args()
    wheels = sorted(args.wheels.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"no wheels in {args.wheels}")
    check_peer_wheel(wheels, args.spec)
    manifest = {"spec": args.spec, **pack(wheels, args.out, args.part_mib, args.xz_level, args.keep_fa2)}
    (args.out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    parts = manifest["parts"]
    print(f"{len(wheels)} wheels, {sum(w['download_bytes'] for w in manifest['wheels']) / 2**20:.1f} MiB downloaded; "
          f"archive {manifest['archive_bytes'] / 2**20:.1f} MiB in {len(parts)} parts: "
          + ", ".join(f"{p['name']} {p['bytes'] / 2**20:.1f} MiB" for p in parts))
    print(f"carry one part per call with {args.out / 'MANIFEST.json'}: " + " ".join(p["name"] for p in parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
