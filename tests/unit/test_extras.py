"""Optional dependencies: pyproject's extras, and the one-line hint when one is missing."""
import sys
from pathlib import Path

import pytest

from tritongen.cli import _EXTRA_OF, main

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _project() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads(PYPROJECT.read_text())["project"]


def test_extras_users_expect_exist_and_the_hints_name_real_extras():
    extras = _project()["optional-dependencies"]
    assert {"triton", "clients", "openai", "bench", "eval", "dev"} <= set(extras)
    assert set(_EXTRA_OF.values()) <= set(extras)
    assert any(d.startswith("openai") for d in extras["openai"])
    assert any(d.startswith("tritonclient") for d in extras["clients"]) and "tritongen[openai]" in extras["clients"]
    assert any(d.startswith("matplotlib") for d in extras["bench"])


def test_torch_and_transformers_are_ranges_not_pins():
    """A user's CUDA torch must never be replaced by installing tritongen (CI pins the CPU build on
    its command line instead)."""
    deps = {d.split(">")[0].split("=")[0].split("<")[0].strip(): d for d in _project()["dependencies"]}
    for name in ("torch", "transformers"):
        assert "==" not in deps[name] and ">=" in deps[name], deps[name]


def test_bench_plot_without_matplotlib_is_a_one_line_hint(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    rc = main(["bench", "serve", "--target", "openai", "--url", "http://127.0.0.1:9", "--num-prompts", "1",
               "--plot", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert "'matplotlib'" in err and "pip install 'tritongen[bench]'" in err


def test_other_missing_modules_still_raise():
    from tritongen.cli import missing_extra_hint

    assert missing_extra_hint(ModuleNotFoundError("x", name="tritongen.nope")) is None
    assert "tritongen[eval]" in missing_extra_hint(ModuleNotFoundError("x", name="rouge_score"))
