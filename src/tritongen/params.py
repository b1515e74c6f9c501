"""Request parameters: SamplingParams, and on each of its fields everything a front needs to know
about it. Pure Python: importing this never imports torch or a front.

Each field is written once, in SamplingParams below: its name and type (the annotation), its
default, bounds and the names other APIs give it (`param(...)`), and its doc (the docstring under
it). PARAMS is that table, one Param per field; every front builds its sampling schema from it:
- OpenAI (openai/protocol.py): a request field of the same name (`openai`), nullable or not;
- Triton (triton/codec.py): an input tensor of the same name of this data type (`triton`), the
  aliases TensorRT-LLM / FasterTransformer clients send (`aliases`), the name in TensorRT-LLM's
  ensemble (`ensemble`) and FasterTransformer's spelling (`ft`, triton/layouts.py), and a key of
  the sampling_parameters JSON (`json`, vllm_backend layout);
- `tritongen generate` (cli.py): a flag (`cli`), with its own default where it differs.
tests/unit/test_param_table.py checks that each front declares exactly these fields.
"""
from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any, Optional

MAX_INT = 2 ** 31 - 1
"""Bound of the integer counts (max_tokens, min_tokens, top_k): an int32, as Triton's tensors carry them."""
SEED_MIN, SEED_MAX = -(2 ** 63), 2 ** 64 - 1
"""What torch.Generator.manual_seed takes (a negative seed s acts as s + 2**64)."""
MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024
"""Every stop string is searched for in the new text at every step, and streaming holds back up
to its length - 1 characters: these bound that work per request."""
MAX_STOP_TOKEN_IDS = 1024
_F32_MAX = 3.4028234663852886e38
_F32_TINY = 1.1754943508222875e-38  # the smallest normal float32


@dataclass(frozen=True)
class Bounds:
    """The closed range [low, high] (or (low, high] when low_open) a number must lie in."""

    low: float
    high: float
    low_open: bool = False
    what: str = ""
    """How the error message states the range, when not "an integer in [low, high]"."""


@dataclass(frozen=True)
class Wire:
    """A field's tensor in another backend's layout; data_type / dims None: as the engine model's."""

    name: str
    data_type: Optional[str] = None
    dims: Optional[tuple[int, ...]] = None


_CLI_AS_DEFAULT = object()


def param(default: Any = None, bounds: Optional[Bounds] = None, *, openai: bool = True, openai_null: bool = True,
          triton: Optional[str] = None, dims: tuple[int, ...] = (1,), aliases: tuple[str, ...] = (),
          ensemble: Optional[str] = None, ft: Optional[Wire] = None, json: bool = True,
          zero_default: tuple[str, ...] = (), sets_sampling: bool = False, cli: Optional[str] = None,
          cli_default: Any = _CLI_AS_DEFAULT) -> Any:
    """A SamplingParams field with its bounds and front names (see Param for each argument)."""
    spec = dict(bounds=bounds, openai=openai, openai_null=openai_null, triton=triton, dims=dims, aliases=aliases,
                ensemble=ensemble, ft=ft, json=json, zero_default=zero_default, sets_sampling=sets_sampling, cli=cli,
                cli_default=default if cli_default is _CLI_AS_DEFAULT else cli_default)
    if isinstance(default, list):
        return field(default_factory=list, metadata={"param": spec})
    return field(default=default, metadata={"param": spec})


_INT32, _FP32, _BOOL, _STRING = "TYPE_INT32", "TYPE_FP32", "TYPE_BOOL", "TYPE_STRING"


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop. Names and defaults follow vLLM / the OpenAI API."""

    max_tokens: int = param(16, Bounds(1, MAX_INT), triton=_INT32, aliases=("request_output_len",),
                            ensemble="max_tokens", ft=Wire("request_output_len", "TYPE_UINT32", (-1,)),
                            cli="--max-tokens", cli_default=64)
    """Most tokens to generate."""
    temperature: float = param(1.0, Bounds(0.0, _F32_MAX), triton=_FP32, ensemble="temperature",
                               ft=Wire("temperature"), sets_sampling=True, cli="--temperature", cli_default=0.0)
    """0 means greedy (argmax); higher is more random."""
    top_p: float = param(1.0, Bounds(0.0, 1.0, low_open=True), triton=_FP32, aliases=("runtime_top_p",),
                         ensemble="top_p", ft=Wire("runtime_top_p"), zero_default=("triton",), sets_sampling=True,
                         cli="--top-p")
    """Nucleus sampling: keep the smallest set of tokens whose probability sums to top_p, in (0, 1]."""
    top_k: int = param(-1, Bounds(-1, MAX_INT, what=f"-1 (disable) or an integer in [0, {MAX_INT}]"),
                       triton=_INT32, aliases=("runtime_top_k",), ensemble="top_k",
                       ft=Wire("runtime_top_k", "TYPE_UINT32"), zero_default=("openai",), sets_sampling=True,
                       cli="--top-k")
    """Keep the k most likely tokens; -1 or 0 keeps all."""
    min_p: float = param(0.0, Bounds(0.0, 1.0), triton=_FP32, cli="--min-p")
    """Drop tokens whose probability is below min_p times the top token's, in [0, 1]."""
    # Divided into logits in float32: it must stay a finite non-zero float32.
    repetition_penalty: float = param(1.0, Bounds(_F32_TINY, _F32_MAX), triton=_FP32, ensemble="repetition_penalty",
                                      ft=Wire("repetition_penalty"), cli="--repetition-penalty")
    """HF-style: divides positive (multiplies negative) logits of tokens seen in prompt or output; > 0."""
    presence_penalty: float = param(0.0, Bounds(-2.0, 2.0), triton=_FP32, ensemble="presence_penalty",
                                    ft=Wire("presence_penalty"), cli="--presence-penalty")
    """OpenAI-style: subtracted once from logits of tokens already generated, in [-2, 2]."""
    frequency_penalty: float = param(0.0, Bounds(-2.0, 2.0), triton=_FP32, ensemble="frequency_penalty",
                                     ft=Wire("frequency_penalty"), cli="--frequency-penalty")
    """OpenAI-style: subtracted per occurrence from logits of tokens already generated, in [-2, 2]."""
    seed: Optional[int] = param(None, Bounds(SEED_MIN, SEED_MAX, what="a 64-bit integer"), triton="TYPE_UINT64",
                                aliases=("random_seed",), ensemble="random_seed", ft=Wire("random_seed"),
                                cli="--sampling-seed")
    """Per-request seed: the same seed gives the same output whatever else is in the batch."""
    min_tokens: int = param(0, Bounds(0, MAX_INT), openai_null=False, triton=_INT32, aliases=("min_length",),
                            ensemble="min_length", ft=Wire("min_length", "TYPE_UINT32"), cli="--min-tokens")
    """EOS and stop_token_ids are masked until this many tokens are generated."""
    ignore_eos: bool = param(False, openai_null=False, triton=_BOOL, cli="--ignore-eos")
    """Keep generating past EOS (benchmarks)."""
    stop: list[str] = param([], triton=_STRING, dims=(-1,), aliases=("stop_words",), ensemble="stop_words",
                            cli="--stop")
    """Strings that end generation; they are cut from the output."""
    stop_token_ids: list[int] = param([], cli="--stop-token-id")
    """Token ids that end generation (in addition to EOS)."""
    include_stop_str_in_output: bool = param(False, openai_null=False, cli="--include-stop-str-in-output")
    """Keep the matched stop string in the text."""
    logprobs: Optional[int] = param(None, Bounds(0, MAX_LOGPROBS), openai=False)
    """Return the chosen token's logprob and this many top alternatives (0 = chosen only)."""
    prompt_logprobs: Optional[int] = param(None, Bounds(0, MAX_LOGPROBS), openai=False, json=False)
    """Return each prompt token's logprob (given the tokens before it) and this many top alternatives.
    Such requests skip prefix-cache hits: every prompt position must go through the model."""
    skip_special_tokens: bool = param(True, openai_null=False, cli="--skip-special-tokens")
    """Leave special tokens out of the detokenized text."""

    _valid_for = None
    """Not a field: what the last validate() that passed checked: None nothing, -1 the bounds, n the
    bounds and stop_token_ids against a vocabulary of n tokens."""

    def __post_init__(self) -> None:
        # Normalise the shapes fronts commonly pass; anything else is left for validate() to name.
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None or isinstance(self.stop, tuple):
            self.stop = list(self.stop or [])
        if self.stop_token_ids is None or isinstance(self.stop_token_ids, tuple):
            self.stop_token_ids = list(self.stop_token_ids or [])

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name != "_valid_for":
            object.__setattr__(self, "_valid_for", None)  # a changed field is checked again

    @property
    def uses_penalties(self) -> bool:
        """Repetition, presence or frequency penalty: sampling reads the tokens so far."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def samples_from_host_tokens(self, num_output_tokens: int) -> bool:
        """Whether sampling the token after `num_output_tokens` outputs reads the request's tokens
        on the host: penalties count them, and min_tokens stops masking EOS exactly there. Such a
        step cannot be scheduled before the previous one's token is known."""
        return self.uses_penalties or num_output_tokens == self.min_tokens

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def validated(self) -> bool:
        """validate() passed and no field was assigned since."""
        return self._valid_for is not None

    def validate(self, vocab_size: Optional[int] = None) -> None:
        """Raise ValueError whose message starts with the offending field's name; called before a
        request is queued. Whatever passes here must not fail the engine later (the bounds are what
        the sampler's tensors and the per-step host work can take), so a request's own data can
        only fail that request, and at the front. With `vocab_size` (known to the engine)
        stop_token_ids must also be in the vocabulary.

        The bounds are checked once per request: the front validates, and the engine's own call
        on the same object (assigning a field clears the mark) checks only what the front could
        not, the vocabulary. A request from a path without a front (LLM.generate) is checked
        entirely there."""
        if self._valid_for is None:
            for p in PARAMS:
                p.check(getattr(self, p.name))
            if self.min_tokens > self.max_tokens:
                raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
            self._validate_stops(vocab_size)
        elif vocab_size is not None and self._valid_for != vocab_size:
            for t in self.stop_token_ids:
                _check_int("stop_token_ids", t, 0, vocab_size - 1, f"token ids in [0, {vocab_size - 1}]")
        self._valid_for = vocab_size or self._valid_for or -1

    def _validate_stops(self, vocab_size: Optional[int]) -> None:
        if not isinstance(self.stop, list) or len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop must be a list of at most {MAX_STOP_STRINGS} strings")
        for s in self.stop:
            if not isinstance(s, str) or not 0 < len(s) <= MAX_STOP_CHARS:
                raise ValueError(f"stop must hold non-empty strings of at most {MAX_STOP_CHARS} characters, "
                                 f"got {_short(s)}")
        if not isinstance(self.stop_token_ids, list) or len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"stop_token_ids must be a list of at most {MAX_STOP_TOKEN_IDS} token ids")
        top = MAX_INT if vocab_size is None else vocab_size - 1
        for t in self.stop_token_ids:
            _check_int("stop_token_ids", t, 0, top, f"token ids in [0, {top}]")


# -- the table ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Param:
    """One SamplingParams field as the fronts see it."""

    name: str
    kind: type
    """int | float | bool | str; for a list field, the kind of its items."""
    is_list: bool
    optional: bool
    """None is a value (no seed, no logprobs)."""
    default: Any
    bounds: Optional[Bounds]
    openai: bool
    """A field of the OpenAI request bodies of this name. logprobs / prompt_logprobs are not:
    each endpoint spells them its own way (serving.py)."""
    openai_null: bool
    """In the OpenAI schema: Optional (null or absent means the default) or the plain type."""
    triton: Optional[str]
    """Data type of the engine model's input tensor of this name (None: no tensor, JSON only)."""
    dims: tuple[int, ...]
    aliases: tuple[str, ...]
    """Other input tensors that set this field (TensorRT-LLM / FasterTransformer names); a
    request with one of them is laid out as TensorRT-LLM's (no echo, greedy by default)."""
    ensemble: Optional[str]
    """Its input name in TensorRT-LLM's ensemble (`--layout ensemble`)."""
    ft: Optional[Wire]
    """Its input in FasterTransformer's layout."""
    json: bool
    """A key of sampling_parameters (vllm_backend's JSON) and of HTTP /generate parameters."""
    zero_default: tuple[str, ...]
    """Fronts ("openai", "triton": the tensors) where 0 means the default (disabled)."""
    sets_sampling: bool
    """Sets how tokens are drawn: a TensorRT-LLM-style request without any of these is greedy."""
    cli: Optional[str]
    """Flag of `tritongen generate`."""
    cli_default: Any

    @property
    def doc(self) -> str:
        return _docs().get(self.name, "")

    @property
    def tensor_names(self) -> tuple[str, ...]:
        return ((self.name,) + self.aliases) if self.triton else ()

    def read(self, front: str, value: Any) -> Any:
        """A value `front` sent for this field, or None where it means the default (absent, null,
        or 0 on a front of zero_default)."""
        if value is None or (front in self.zero_default and value == 0 and not isinstance(value, bool)):
            return None
        return value

    def check(self, value: Any) -> None:
        """ValueError starting with the field's name unless `value` is of its kind and in bounds
        (list fields are checked by SamplingParams._validate_stops)."""
        if self.is_list or (value is None and self.optional):
            return
        b = self.bounds
        if self.kind is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{self.name} must be a boolean, got {_short(value)}")
        elif self.kind is int:
            _check_int(self.name, value, b.low, b.high, b.what)
        else:
            _check_float(self.name, value, b.low, b.high, b.low_open)


def _kind(annotation: Any) -> tuple[type, bool, bool]:
    """(kind, is_list, optional) of a field's annotation."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    optional = typing.get_origin(annotation) is typing.Union
    if optional:
        annotation = args[0]
    if typing.get_origin(annotation) is list:
        return typing.get_args(annotation)[0], True, optional
    return annotation, False, optional


def _table() -> tuple[Param, ...]:
    hints = typing.get_type_hints(SamplingParams)
    rows = []
    for f in fields(SamplingParams):
        kind, is_list, optional = _kind(hints[f.name])
        default = [] if is_list else f.default
        rows.append(Param(name=f.name, kind=kind, is_list=is_list, optional=optional, default=default,
                          **f.metadata["param"]))
    return tuple(rows)


PARAMS: tuple[Param, ...] = _table()
BY_NAME: dict[str, Param] = {p.name: p for p in PARAMS}


@cache
def _docs() -> dict[str, str]:
    """The docstring under each field (read from the source on first use: CLI help, schema docs)."""
    import ast
    import inspect

    try:
        body = ast.parse(inspect.getsource(SamplingParams)).body[0].body
    except (OSError, TypeError):  # installed without its sources: no help texts, nothing else lost
        return {}
    return {prev.target.id: " ".join(str(node.value.value).split()) for prev, node in zip(body, body[1:])
            if isinstance(prev, ast.AnnAssign) and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}


# -- checks ---------------------------------------------------------------------------------------

def _short(value: object) -> str:
    if isinstance(value, int) and value.bit_length() > 128:  # repr() of a huge int is slow or refused
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_int(name: str, value: object, low: int, high: int, what: str = "") -> None:
    """An int (not a bool) in [low, high], else ValueError starting with `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be {what or f'an integer in [{low}, {high}]'}, got {_short(value)}")


def _check_float(name: str, value: object, low: float, high: float, low_open: bool = False) -> None:
    """A real number (not a bool, not NaN or inf) in [low, high] (or (low, high]), else ValueError."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    # abs() first: an int beyond the float range would overflow the comparisons' conversion.
    ok = ok and abs(value) <= _F32_MAX * 2 and math.isfinite(value) and value <= high
    ok = ok and (low < value if low_open else low <= value)
    if not ok:
        bracket = "(" if low_open else "["
        raise ValueError(f"{name} must be a number in {bracket}{low:g}, {high:g}], got {_short(value)}")
