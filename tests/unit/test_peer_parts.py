"""benchmarks/peers: parts built by pack_parts.py arrive one per call through receive_part.sh (sha256
checked, kept across calls, a damaged part refused); bench/peers.py's peer commands need no peer."""
from __future__ import annotations

import importlib.util
import json
import random
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "benchmarks" / "peers"


def _pack_parts():
    spec = importlib.util.spec_from_file_location("pack_parts", PEERS / "pack_parts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake_vllm_wheel(path: Path) -> None:
    """A wheel named vllm holding a file for every strip rule, kept files (one incompressible, so
    that the archive needs two 1 MiB parts) and its RECORD."""
    kept = {"vllm/__init__.py": b"x = 1\n" * 1000, "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": random.Random(0).randbytes(1_600_000)}
    dropped = {"vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"fa2", "vllm/_moe_C_stable_libtorch.abi3.so": b"moe",
               "vllm/vllm-rs": b"rs", "vllm/third_party/deep_gemm/_C.cpython-313-x86_64-linux-gnu.so": b"dg"}
    files = {**kept, **dropped, "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so": b"dg312"}
    record = "".join(f"{n},sha256=x,{len(d)}\n" for n, d in files.items()) + "vllm-0.1.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("vllm-0.1.dist-info/RECORD", record)


def test_pack_strips_rewrites_record_and_parts_arrive_one_per_call(tmp_path: Path) -> None:
    if not shutil.which("xz"):
        pytest.skip("xz not installed")
    pack_parts = _pack_parts()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _fake_vllm_wheel(wheels / "vllm-0.1-cp38-abi3-manylinux_2_28_x86_64.whl")
    (wheels / "other-1.0-py3-none-any.whl").write_bytes((wheels / "vllm-0.1-cp38-abi3-manylinux_2_28_x86_64.whl")
                                                         .read_bytes())  # not a vllm wheel: nothing stripped
    out = tmp_path / "repo" / ".gpu" / "peers" / "vllm"
    manifest = pack_parts.pack(sorted(wheels.glob("*.whl")), out, part_mib=1, xz_level="0", keep_fa2=False)
    stripped = manifest["stripped"]["vllm-0.1-cp38-abi3-manylinux_2_28_x86_64.whl"]["files"]
    assert sorted(stripped) == ["vllm/_moe_C_stable_libtorch.abi3.so",
                                "vllm/third_party/deep_gemm/_C.cpython-313-x86_64-linux-gnu.so",
                                "vllm/vllm-rs", "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"]
    assert list(manifest["stripped"]) == ["vllm-0.1-cp38-abi3-manylinux_2_28_x86_64.whl"]
    (out / "MANIFEST.json").write_text(json.dumps(manifest))

    # The archive unpacks to stored wheels whose RECORD no longer names the stripped files.
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    joined = b"".join(p.read_bytes() for p in sorted(out.glob("part*")))
    subprocess.run(["tar", "-xJf", "-", "-C", str(unpacked)], input=joined, check=True)
    with zipfile.ZipFile(unpacked / "vllm-0.1-cp38-abi3-manylinux_2_28_x86_64.whl") as z:
        names = set(z.namelist())
        record = z.read("vllm-0.1.dist-info/RECORD").decode()
        assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist())
    assert "vllm/__init__.py" in names and not names & set(stripped)
    assert "deep_gemm/_C.cpython-312" in record and not any(s in record for s in stripped)

    # One part per "call" into a fresh stash; a damaged copy is refused and the stash keeps what it had.
    repo, stash = tmp_path / "repo", tmp_path / "stash"
    shutil.copytree(PEERS, repo / "benchmarks" / "peers")
    parts = sorted(p.name for p in out.glob("part*"))
    assert len(parts) >= 2
    carried = tmp_path / "all_parts"
    shutil.move(str(out), carried)

    def call(*names: str, damage: bool = False) -> subprocess.CompletedProcess:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        shutil.copy(carried / "MANIFEST.json", out)
        for n in names:
            shutil.copy(carried / n, out)
            if damage:
                (out / n).write_bytes(b"?" + (out / n).read_bytes()[1:])
        return subprocess.run(["bash", str(repo / "benchmarks/peers/receive_part.sh")], capture_output=True,
                              text=True, env={"PATH": "/usr/bin:/bin:" + str(Path(sys.executable).parent),
                                              "PEER_STASH": str(stash)})

    first = call(parts[0])
    assert first.returncode == 0 and "empty" in first.stdout and f"received {parts[0]}" in first.stdout
    bad = call(parts[1], damage=True)
    assert bad.returncode == 1 and f"BAD PART {parts[1]}" in bad.stdout and "1 good parts" in bad.stdout
    for n in parts[1:]:
        last = call(n)
        assert last.returncode == 0, last.stdout + last.stderr
    assert last.stdout.strip().endswith(f"complete: {len(parts)}/{len(parts)} parts")


def test_peer_commands_and_missing_peer_message() -> None:
    from tritongen.bench import peers

    assert peers.cli_flags({"max_num_seqs": 64, "enforce_eager": True, "enable_chunked_prefill": False,
                            "compilation_config": {"level": 3}, "block_size": None}) == [
        "--max-num-seqs", "64", "--enforce-eager", "--no-enable-chunked-prefill", "--compilation-config",
        '{"level": 3}']
    cmd = peers.VllmSide.server_command("/ckpt", 8123, "bfloat16", 0, {"max_num_seqs": 256})
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--port") + 1] == "8123" and "--no-enable-prefix-caching" in cmd
    ours = peers.OursSide.server_command("/ckpt", 9000, {"dtype": "bfloat16", "enable_prefix_caching": False})
    assert ours[ours.index("--model") + 1] == "/ckpt" and "--no-enable-prefix-caching" in ours
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(SystemExit, match="install_vllm.sh"):
            peers.check_available("vllm")


def test_fetch_wheels_reports_requirements_the_closure_breaks():
    """The walk takes the first requirement of each name; conflicts() then checks every asker (vLLM
    0.25.1 pins apache-tvm-ffi==0.1.9 while xgrammar 0.2.9 asks >=0.1.11: that pair failed at import)."""
    spec = importlib.util.spec_from_file_location("fetch_wheels", PEERS / "fetch_wheels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    wheels = [{"name": "vllm", "version": "0.25.1", "requires": ["apache-tvm-ffi==0.1.9", "xgrammar<1.0.0,>=0.2.1"]},
              {"name": "apache-tvm-ffi", "version": "0.1.9", "requires": []},
              {"name": "xgrammar", "version": "0.2.9", "requires": ["apache-tvm-ffi>=0.1.11", "torch>=1.10"]}]
    assert mod.conflicts(wheels) == ["xgrammar 0.2.9 asks apache-tvm-ffi>=0.1.11, the closure has 0.1.9"]
    wheels[2] = {"name": "xgrammar", "version": "0.2.1", "requires": ["apache-tvm-ffi>=0.1.9"]}
    assert mod.conflicts(wheels) == []


def test_a_release_specific_strip_rule_applies_to_that_release_only(tmp_path: Path):
    pack_parts = _pack_parts()
    assert "xgrammar/lib/libxgrammar.a" in pack_parts.strip_rules(
        tmp_path / "xgrammar-0.2.1-cp312-cp312-manylinux_2_28_x86_64.whl", keep_fa2=False)
    assert pack_parts.strip_rules(tmp_path / "xgrammar-0.2.9-cp312-cp312-manylinux_2_28_x86_64.whl", keep_fa2=False) == {}
