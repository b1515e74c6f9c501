"""OpenAI API request and response bodies (the subset we serve), as pydantic models.

Requests ignore unknown fields, as OpenAI-compatible servers usually do, so that newer SDKs keep
working. Fields we cannot honour are declared so that serving.py can reject them with a clear 400
instead of silently ignoring them. Types are strict, as the OpenAI API's are: "4" or true is not
an integer, 1 is not a boolean (an int is still a valid float).
"""
from __future__ import annotations

import time
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, create_model, model_serializer

from tritongen.params import PARAMS, Param


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)


class StreamOptions(_Request):
    include_usage: bool = False


class _RequestFields(_Request):
    """What /v1/completions and /v1/chat/completions share beyond the sampling fields: the request
    itself (model, stream, ...) and what we refuse unless at its neutral value (n, best_of, logit_bias)."""

    model: Optional[str] = None
    n: Optional[int] = Field(None, ge=1)
    best_of: Optional[int] = Field(None, ge=1)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    logit_bias: Optional[dict[str, float]] = None
    user: Optional[str] = None
    return_perf_metrics: bool = False
    """tritongen's opt-in: `usage.perf_metrics` with this request's timings (streaming: in the usage
    chunk of stream_options.include_usage)."""


def _openai_type(p: Param) -> Any:
    """A field's type on the wire; a list of strings may also be one string (OpenAI's `stop`)."""
    kind = (Union[str, list[str]] if p.kind is str else list[p.kind]) if p.is_list else p.kind
    return Optional[kind] if p.openai_null else kind


OPENAI_PARAMS: tuple[Param, ...] = tuple(p for p in PARAMS if p.openai)
"""The sampling fields both endpoints take by SamplingParams' names (OpenAI's, plus vLLM's extras)."""

_SamplingFields = create_model(
    "_SamplingFields", __base__=_RequestFields,
    **{p.name: (_openai_type(p), Field(None if p.openai_null else p.default, description=p.doc))
       for p in OPENAI_PARAMS})


Prompt = Union[str, list[int], list[Union[str, list[int]]]]


class CompletionRequest(_SamplingFields):
    prompt: Prompt
    logprobs: Optional[int] = None
    echo: bool = False
    suffix: Optional[str] = None


class ContentPart(_Request):
    type: str
    text: Optional[str] = None


Role = Literal["system", "developer", "user", "assistant", "tool"]


class ChatMessage(_Request):
    role: Role
    content: Optional[Union[str, list[ContentPart]]] = None
    name: Optional[str] = None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = None
    tools: Optional[list[Any]] = None
    response_format: Optional[dict[str, Any]] = None
    add_generation_prompt: bool = True


# -- responses --------------------------------------------------------------------------------

class PerfMetrics(BaseModel):
    """One prompt's timings in the engine: wall-clock seconds (time.time() of the server's host),
    and the durations a client computes from them."""

    arrival_time: float
    first_scheduled_time: Optional[float] = None
    first_token_time: Optional[float] = None
    last_token_time: Optional[float] = None
    queue_time: Optional[float] = None
    """first_scheduled_time - arrival_time"""
    time_to_first_token: Optional[float] = None
    """first_token_time - arrival_time"""
    time_per_output_token: Optional[float] = None
    """(last_token_time - first_token_time) / (completion tokens - 1)"""
    num_cached_tokens: int = 0
    """Prompt tokens served from the prefix cache."""


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    perf_metrics: Optional[Union[PerfMetrics, list[PerfMetrics]]] = None
    """With return_perf_metrics: one object, or one per prompt for several completion prompts."""

    @model_serializer(mode="wrap")
    def _drop_unasked(self, handler):
        data = handler(self)
        if data.get("perf_metrics") is None:
            data.pop("perf_metrics", None)
        return data


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] = Field(default_factory=list)


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage


class DeltaMessage(BaseModel):
    role: Optional[str] = None
    content: Optional[str] = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler):
        # OpenAI leaves absent delta fields out rather than sending null.
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "tritongen"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
