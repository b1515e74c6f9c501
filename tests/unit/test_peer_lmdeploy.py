"""LMDeploy as a peer: pack_parts.py strips TurboMind's libraries from the lmdeploy wheel and keeps
its Python (turbomind/__init__.py is what reports it unavailable), a rule that matches nothing or a
missing lmdeploy wheel stops the build, install_parts.sh takes the parts to an importable
--target site offline, and bench/peers.py builds LMDeploy's engine config and server command."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "benchmarks" / "peers"
WHEEL = "lmdeploy-0.18.0-py3-none-any.whl"
TURBOMIND_INIT = '''
_import_error = None
try:
    from . import _turbomind as _tm
except (ImportError, OSError) as error:
    _tm = None
    _import_error = error


def is_available():
    return _tm is not None
'''


def _pack_parts():
    spec = importlib.util.spec_from_file_location("pack_parts", PEERS / "pack_parts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake_lmdeploy_wheel(path: Path, with_stub: bool = True) -> None:
    """lmdeploy's layout in small: the package, TurboMind's Python and its libraries, a RECORD."""
    files = {"lmdeploy/__init__.py": "__version__ = '0.18.0'\n", "lmdeploy/turbomind/__init__.py": TURBOMIND_INIT,
             "lmdeploy/turbomind/turbomind.py": "x = 1\n", "lmdeploy/pytorch/__init__.py": "",
             "lmdeploy/turbomind/_turbomind.cpython-312-x86_64-linux-gnu.so": "ELF?",
             "lmdeploy/turbomind/lib64/libxgrammar.a": "!<arch>"}
    if with_stub:
        files["lmdeploy/turbomind/lib/libturbomind_nccl_stub.so"] = "ELF?"
    meta = "Metadata-Version: 2.1\nName: lmdeploy\nVersion: 0.18.0\n"
    wheel = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files.update({"lmdeploy-0.18.0.dist-info/METADATA": meta, "lmdeploy-0.18.0.dist-info/WHEEL": wheel})
    record = "".join(f"{n},,\n" for n in files) + "lmdeploy-0.18.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("lmdeploy-0.18.0.dist-info/RECORD", record)


def test_strip_rules_keep_turbomind_python_and_fail_when_unmatched(tmp_path: Path) -> None:
    pack_parts = _pack_parts()
    _fake_lmdeploy_wheel(tmp_path / WHEEL)
    rules = pack_parts.strip_rules(tmp_path / WHEEL, keep_fa2=False)
    gone = pack_parts.rewrite_stored(tmp_path / WHEEL, tmp_path / "stored.whl", rules)
    assert sorted(gone) == ["lmdeploy/turbomind/_turbomind.cpython-312-x86_64-linux-gnu.so",
                            "lmdeploy/turbomind/lib/libturbomind_nccl_stub.so", "lmdeploy/turbomind/lib64/libxgrammar.a"]
    with zipfile.ZipFile(tmp_path / "stored.whl") as z:
        assert {"lmdeploy/turbomind/__init__.py", "lmdeploy/turbomind/turbomind.py"} <= set(z.namelist())
        assert "libxgrammar" not in z.read("lmdeploy-0.18.0.dist-info/RECORD").decode()

    (tmp_path / "new").mkdir()  # a release without one of the stripped files: look at its sources again
    _fake_lmdeploy_wheel(tmp_path / "new" / WHEEL, with_stub=False)
    with pytest.raises(SystemExit, match="strip rules match no file"):
        pack_parts.rewrite_stored(tmp_path / "new" / WHEEL, tmp_path / "stored2.whl", rules)
    with pytest.raises(SystemExit, match="no lmdeploy wheel"):
        pack_parts.check_peer_wheel([tmp_path / "other-1.0-py3-none-any.whl"], "lmdeploy==0.18.0")
    pack_parts.check_peer_wheel([tmp_path / WHEEL], "lmdeploy==0.18.0")


def test_parts_install_offline_into_a_target_site(tmp_path: Path) -> None:
    if not shutil.which("xz"):
        pytest.skip("xz not installed")
    pack_parts = _pack_parts()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _fake_lmdeploy_wheel(wheels / WHEEL)
    repo = tmp_path / "repo"
    shutil.copytree(PEERS, repo / "benchmarks" / "peers")
    out = repo / ".gpu" / "peers" / "lmdeploy"
    manifest = pack_parts.pack(sorted(wheels.glob("*.whl")), out, part_mib=56, xz_level="0", keep_fa2=False)
    (out / "MANIFEST.json").write_text(json.dumps(manifest))
    assert [p["name"] for p in manifest["parts"]] == ["part00"]
    site, stash = tmp_path / "site", tmp_path / "stash"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHON": sys.executable}
    cmd = ["bash", str(repo / "benchmarks/peers/install_parts.sh"), str(out), str(site), str(stash)]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.strip().splitlines()[-1] == f"installed: {site}"
    again = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert again.stdout.strip().splitlines()[-1] == f"already installed: {site}"
    check = subprocess.run([sys.executable, "-c", "from lmdeploy import turbomind; print(turbomind.is_available(), "
                            "type(turbomind._import_error).__name__)"], capture_output=True, text=True,
                           env={**env, "PYTHONPATH": str(site)})
    assert check.stdout.split() == ["False", "ImportError"], check.stderr


def test_lmdeploy_side_commands_and_missing_peer_message() -> None:
    from tritongen.bench import peers

    assert "lmdeploy" in peers.PEERS
    config = peers.lmdeploy_engine_config("bfloat16", {"max_batch_size": 256, "eager_mode": True})
    assert config == {"dtype": "bfloat16", "enable_prefix_caching": False, "max_batch_size": 256, "eager_mode": True}
    cmd = peers.LmdeploySide.server_command("/ckpt", 8123, "bfloat16", {"max_batch_size": 256, "eager_mode": True})
    assert cmd[1:6] == ["-m", "lmdeploy", "serve", "api_server", "/ckpt"]
    assert cmd[cmd.index("--backend") + 1] == "pytorch" and cmd[cmd.index("--server-port") + 1] == "8123"
    assert cmd[cmd.index("--server-name") + 1] == "127.0.0.1" and cmd[cmd.index("--dtype") + 1] == "bfloat16"
    assert cmd[cmd.index("--max-batch-size") + 1] == "256" and "--eager-mode" in cmd
    assert not any("prefix-caching" in c for c in cmd)  # store_true flags: False is the default, no --no-*
    if importlib.util.find_spec("lmdeploy") is None:
        with pytest.raises(SystemExit, match="install_lmdeploy.sh.*peer-site-lmdeploy"):
            peers.check_available("lmdeploy")


def test_peer_suite_builds_lmdeploy_server_command() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import peer_suite
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    args = peer_suite.parse_args(["--peer", "lmdeploy", "--sides", "peer", "--dtype", "bfloat16",
                                  "--lmdeploy-kwargs", '{"max_batch_size": 128}'])
    assert args.sides == ["lmdeploy"] and "lmdeploy_kwargs" in peer_suite.settings(args, {})
    cmd = peer_suite.server_command("lmdeploy", "/ckpt", 9001, {}, args)
    assert cmd[cmd.index("--max-batch-size") + 1] == "128" and cmd[cmd.index("--server-port") + 1] == "9001"


def test_check_site_imports_tells_guarded_from_unguarded(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("check_site_imports", PEERS / "check_site_imports.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    site = tmp_path / "site"
    files = {"pkg/__init__.py": "from . import engine\n", "pkg/turbo/__init__.py": TURBOMIND_INIT,
             "pkg/engine.py": "import json\nimport numpy\nfrom pkg import turbo\ntry:\n    import absent_a\n"
                              "except ImportError:\n    pass\nif sys.version_info < (3, 11):\n    import tomli\n"
                              "def later():\n    import absent_b\n",
             "pkg/bad.py": "from pkg.turbo import _turbomind\nimport absent_c\n",
             "pkg/optional.py": "try:\n    from pkg import bad\nexcept ImportError:\n    bad = None\n"}
    for name, text in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    ok = mod.walk(site, ["pkg", "pkg.optional"], ["pkg.turbo._turbomind"], known={"numpy"})
    assert ok["forbidden"] == [] and ok["missing"] == {}  # bad is reached only through a try block
    out = mod.walk(site, ["pkg", "pkg.bad"], ["pkg.turbo._turbomind"], known={"numpy"})
    assert out["forbidden"] == ["pkg.bad imports pkg.turbo._turbomind"] and out["missing"] == {"absent_c": "pkg.bad"}


def test_peer_suite_offline_fractions_use_each_sides_batch_limit() -> None:
    """vLLM ran 1024 sequences a step where we ran 256: each side's fraction is of its own floor."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import peer_suite
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from tritongen.bench import roofline
    from tritongen.models.arch import ModelArch
    from tritongen.models.presets import PRESETS

    arch = ModelArch.from_hf_config(PRESETS["llama-2-7b"])
    args = peer_suite.parse_args(["--peer", "vllm", "--dtype", "bfloat16"])
    pairs = [(200, 300)] * 1000
    state = {"runs": {"tritongen": {"config": {"max_num_seqs": 256}, "offline": {"rps": 20.0, "elapsed_time": 50.0}},
                      "vllm": {"config": {"max_num_seqs": 1024}, "offline": {"rps": 25.0, "elapsed_time": 40.0}}}}
    rows = {r.name: r for r in peer_suite.rows(state, "vllm", arch, args, pairs)}
    row = rows[f"offline {args.dataset}-{args.num_prompts} rps"]
    hw = roofline.Hardware()
    ours, peer = (roofline.dataset_floor(arch, "bfloat16", pairs, b, hw)["floor_s"] for b in (256, 1024))
    assert peer < ours  # 299 decode steps instead of 1168: fewer weight reads
    assert row.fraction == ours / 50.0 and f"peer fraction {peer / 40.0:.3g}" in row.note
    assert state["offline_floors"]["peer"] == {"max_batch": 1024, "floor_s": peer}


def test_peer_suite_keeps_the_workers_ceilings_for_the_floors(tmp_path: Path, monkeypatch) -> None:
    """The copy bandwidth and GEMM rate a worker measured on its GPU go into the state, so the
    table's floors are this GPU's (an H100's), not DESIGN.md's H200 ones."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import peer_suite
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from tritongen.bench import roofline
    from tritongen.models.arch import ModelArch
    from tritongen.models.presets import PRESETS

    ceilings = {"bandwidth": 3.0e12, "flops": 8.0e14}
    result = {"config": {"max_num_seqs": 256}, "env": {}, "start_s": 1.0, "ceilings": ceilings,
              "offline": {"rps": 20.0, "output_tok_s": 4000.0, "elapsed_time": 50.0}}
    monkeypatch.setattr(peer_suite, "run_worker", lambda side, plan, log_dir, timeout: result)
    args = peer_suite.parse_args(["--peer", "none", "--dtype", "bfloat16", "--workloads", "offline"])
    state = {"runs": {}}
    peer_suite.run_side("tritongen", {}, "", {}, args, None, [], [], tmp_path, state, tmp_path / "state.json")
    assert state["runs"]["tritongen"]["ceilings"] == ceilings
    arch = ModelArch.from_hf_config(PRESETS["llama-2-7b"])
    pairs = [(200, 300)] * 1000
    rows = {r.name: r for r in peer_suite.rows(state, "none", arch, args, pairs)}
    want = roofline.dataset_floor(arch, "bfloat16", pairs, 256, roofline.Hardware(**ceilings))["floor_s"]
    assert state["hardware"] == ceilings and rows[f"offline {args.dataset}-{args.num_prompts} rps"].fraction == want / 50


def test_ceilings_are_measured_in_a_child_process_that_takes_its_memory_with_it() -> None:
    """A worker measures the device's ceilings before its engine starts; done in place, the 4.7 GB
    the measurement left behind made vLLM's offline run go out of memory. The child that measures
    instead is another process, and what it measures is a rate."""
    import os

    from tritongen.bench.peers import ceilings_in_child

    out = ceilings_in_child("float32", "cpu", 1 << 20, 64)
    assert out["pid"] != os.getpid()
    assert out["bandwidth"] > 0 and out["flops"] > 0


def test_the_worker_asks_for_cuda_only_in_the_child(monkeypatch) -> None:
    """After torch.cuda.is_available() in the worker, vLLM's forked engine core cannot use CUDA
    ("Cannot re-initialize CUDA in forked subprocess"), so the worker leaves even that question to
    the child: without CUDA (this machine) the child answers None."""
    import torch

    from tritongen.bench import peers

    if subprocess_has_cuda():
        pytest.skip("with CUDA the child measures for minutes; the question is the same")

    def touched() -> bool:
        raise AssertionError("the worker asked torch about CUDA before the peer's engine started")

    monkeypatch.setattr(torch.cuda, "is_available", touched)
    monkeypatch.setattr(torch.cuda, "device_count", touched)
    assert peers._ceilings("bfloat16") is None


def subprocess_has_cuda() -> bool:
    import subprocess
    import sys

    code = "import torch; print(torch.cuda.is_available())"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "True"


def test_a_failing_ceiling_measurement_says_why() -> None:
    from tritongen.bench.peers import ceilings_in_child

    with pytest.raises(RuntimeError, match="(?s)ceilings failed.*no_such_dtype"):
        ceilings_in_child("no_such_dtype", "cpu", 1 << 20, 64)


def _metrics_server(text: str):
    """A Prometheus text page on 127.0.0.1 (a free port); returns (server, url)."""
    import http.server
    import threading

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/metrics"


def test_serving_rows_sample_the_running_batch_under_vllms_names() -> None:
    """peer_suite samples vllm:num_requests_running / waiting on both servers (vLLM's own gauges,
    our server's aliases), summed over label sets; a page without them gives None, not 0."""
    import time

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_serving
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    page = ('# TYPE vllm:num_requests_running gauge\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 100.0\n'
            'vllm:num_requests_running{engine="1",model_name="m"} 20.0\n'
            '# TYPE vllm:num_requests_waiting gauge\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n')
    for text, want in ((page, {"engine_running": 120.0, "engine_waiting": 3.0}),
                       ("# TYPE other gauge\nother 1.0\n", {"engine_running": None, "engine_waiting": None})):
        server, url = _metrics_server(text)
        try:
            with gpu_serving.GaugeSampler(url, gpu_serving.PEER_GAUGE_SERIES) as gauges:
                time.sleep(2.5 * gpu_serving.GAUGE_PERIOD_S)
        finally:
            server.shutdown()
        assert gauges.means() == want


def test_front_cpu_counts_the_server_process_cpu_per_output_token() -> None:
    """The serving rows' server_cpu: CPU seconds of the server process (read from /proc) over the
    run, per second and per output token; a process that burns 0.3 s of CPU shows at least that."""
    import time

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_serving
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time\nsys.stdin.readline()\nt = time.process_time()\n"
                             "while time.process_time() - t < 0.3: pass\nsys.stdin.readline()"],
                            stdin=subprocess.PIPE, text=True)
    try:
        before = gpu_serving.process_cpu_seconds(proc.pid)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        time.sleep(0.1)
        while gpu_serving.process_cpu_seconds(proc.pid) - before < 0.3:
            time.sleep(0.05)
        out = gpu_serving.front_cpu(proc.pid, before, {"elapsed_time": 2.0, "completion_tokens": 1000})
    finally:
        proc.stdin.write("done\n")
        proc.stdin.flush()
        proc.wait(timeout=30)
    assert 0.3 <= out["server_cpu"] * 2.0 < 2.0 and out["server_cpu_us_per_token"] == pytest.approx(
        1e6 * out["server_cpu"] * 2.0 / 1000)
    assert gpu_serving.process_cpu_seconds(proc.pid) is None  # gone
    assert gpu_serving.front_cpu(proc.pid, before, {"elapsed_time": 2.0, "completion_tokens": 1000}) == {
        "server_cpu": None, "server_cpu_us_per_token": None}
