"""The OpenAI-compatible HTTP server: FastAPI routes over an in-process AsyncLLM.

Routes only translate (serving.py) and move bytes. Every error leaves as OpenAI's
{"error": {"message", "type", "param", "code"}} (DESIGN.md, "Failure contract"): bad input is a
4xx, never a 500; a full server or a dead engine is a 503 `service_unavailable`, never a 400; a
request that fails inside the engine is a 500 `server_error`. Parsing large bodies and tokenizing
run off the event loop, so /health answers while a big prompt is read.
"""
from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from typing import AsyncIterator, Optional

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from tritongen.entrypoints.async_engine import AsyncLLM, EngineDeadError
from tritongen.metrics import RequestTimer, update_engine_gauges
from tritongen.openai import serving
from tritongen.openai.admission import Admission, engine_max_num_seqs
from tritongen.openai.body import parse_json
from tritongen.openai.observability import PrometheusSink
from tritongen.openai.protocol import (
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, CompletionRequest, CompletionResponse, DeltaMessage, ErrorInfo, ErrorResponse,
    ModelCard, ModelList, Usage,
)
from tritongen.openai.serving import RequestError
from tritongen.types import RequestOutput, SamplingParams

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 << 20
_INLINE_PARSE_BYTES = 256 << 10  # bodies above this are parsed in a worker thread, not on the loop


class EngineRequestError(RuntimeError):
    """One request failed inside the engine (its own data); the others go on. A 500."""


def error_response(status: int, message: str, type: str = "invalid_request_error",
                   param: Optional[str] = None, code: Optional[str] = None) -> Response:
    body = ErrorResponse(error=ErrorInfo(message=message, type=type, param=param, code=code))
    return Response(body.model_dump_json(), status_code=status, media_type="application/json")


def _json(model: BaseModel) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")


def _sse(model: BaseModel) -> str:
    return f"data: {model.model_dump_json()}\n\n"


class BodyLimit:
    """ASGI middleware: 413 for request bodies over `limit` bytes, declared or streamed.

    The body is read here and replayed to the app in one message; later receive() calls go to
    the server, so the app still sees http.disconnect.
    """

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._too_large(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self._too_large(scope, receive, send)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope, receive, send) -> None:
        response = error_response(413, f"request body is larger than {self.limit} bytes",
                                  code="request_too_large")
        await response(scope, receive, send)


class SSEResponse(StreamingResponse):
    """Server-sent events that stop (and so abort the engine request) the moment the client leaves,
    whatever ASGI spec version the server speaks."""

    def __init__(self, content) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = None
        """Called once the response is over, however it ended (admission slots go back here: a
        stream cancelled before its first event never runs its generator's finally)."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:
                        pass  # the client went away while we were writing
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            if self.on_close is not None:
                self.on_close()


class OpenAIServer:
    """Per-app state: the engine, the served name, metrics. Handlers are its methods."""

    def __init__(self, engine: AsyncLLM, served_model_name: str, api_key: Optional[str], max_queue: int,
                 max_num_seqs: Optional[int] = None) -> None:
        self.engine = engine
        self.model_name = served_model_name
        self.api_key = api_key
        self.metrics = PrometheusSink(served_model_name)
        self.admission = Admission(engine_max_num_seqs(engine, max_num_seqs), max_queue, self.metrics)
        self._counted: dict[str, float] = {}  # engine counters already exported
        self.text_of = serving.TokenText(engine.tokenizer)
        self.max_model_len = engine.max_model_len
        self.max_prompt_chars = serving.max_chars_per_token(engine.tokenizer) * self.max_model_len
        """Longer text cannot fit in max_model_len tokens: refused before tokenizing."""

    # -- checks shared by the generation routes ----------------------------------------------

    def check_auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise RequestError("invalid or missing API key (send 'Authorization: Bearer <key>')",
                               status=401, code="invalid_api_key")

    def check_model(self, name: Optional[str]) -> None:
        if name is not None and name != self.model_name:
            raise RequestError(f"model {name!r} does not exist; this server serves {self.model_name!r}",
                               "model", status=404, code="model_not_found")

    def check_running(self) -> None:
        if not self.engine.is_running:
            raise RequestError("the engine is not running", status=503, type="service_unavailable",
                               code="engine_unavailable")

    async def parse(self, request: Request, model_cls: type[BaseModel]):
        self.check_auth(request)
        raw = await request.body()
        if len(raw) > _INLINE_PARSE_BYTES:
            body = await asyncio.to_thread(parse_json, raw)
        else:
            body = parse_json(raw)
        try:
            req = model_cls.model_validate(body)
        except ValidationError as exc:
            raise RequestError(*_describe(exc)) from None
        self.check_model(req.model)
        self.check_running()
        return req

    async def admitted(self, slots: int, respond) -> Response:
        """Hold `slots` admission slots while `respond()` builds the response and, for a stream,
        until the stream is over; a 503 at once when they do not fit."""
        ticket = self.admission.admit(slots)
        try:
            response = await respond()
        except BaseException:
            ticket.release()
            raise
        if isinstance(response, SSEResponse):
            response.on_close = ticket.release
        else:
            ticket.release()
        return response

    def tokenize(self, prompt) -> list[int]:
        return self.engine.engine.tokenize(prompt)

    # -- generation ---------------------------------------------------------------------------

    async def outputs(self, ids: list[int], params: SamplingParams, request_id: str,
                      ended: Optional[set[str]] = None) -> AsyncIterator[RequestOutput]:
        """Engine outputs with metrics; a failure inside the engine surfaces as EngineRequestError.
        request_id goes into `ended` once its end (finish or abort) is counted."""
        timer = RequestTimer()
        finished = False
        try:
            async for out in _bad_input_as_400(self.engine.generate(ids, params, request_id)):
                timer.on_output(out, self.metrics)
                finished = out.finished
                if out.error:
                    raise EngineRequestError(out.error)
                yield out
        finally:
            if not finished:  # client left (or the engine died): count it as aborted
                self._count_abort()
            if ended is not None:
                ended.add(request_id)

    def _count_abort(self) -> None:
        self.metrics.increment("tritongen_request_success_total", 1, {"finish_reason": "abort"})

    async def final(self, ids: list[int], params: SamplingParams, request_id: str,
                    ended: Optional[set[str]] = None) -> RequestOutput:
        last = None
        async for last in self.outputs(ids, params, request_id, ended):
            pass
        return last

    async def finals(self, request: Request, runs: list[tuple[list[int], SamplingParams, str]]):
        """The last output of each (ids, params, request_id), generated together; None if the
        client left first, with every one of them aborted and counted as such."""
        ended: set[str] = set()
        outs = await self.until_disconnect(
            request, asyncio.gather(*(self.final(ids, params, rid, ended) for ids, params, rid in runs)))
        if outs is None:
            for _, _, rid in runs:
                if rid not in ended:  # cancelled before it reached the engine
                    self._count_abort()
        return outs

    async def until_disconnect(self, request: Request, coro):
        """Run coro; None if the client disconnects first, after cancelling coro and waiting for
        it, so that its engine requests are aborted (blocks freed, "abort" counted) by then."""
        work = asyncio.ensure_future(coro)
        watcher = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not work.done():
                work.cancel()
                # wait() never raises the task's CancelledError; our own cancellation still does.
                await asyncio.wait({work})
        if work.cancelled() or (watcher.done() and not watcher.cancelled() and work.exception() is not None):
            return None  # the client left: nobody to tell how it ended
        return work.result()

    async def completions(self, request: Request) -> Response:
        req = await self.parse(request, CompletionRequest)
        prompts = serving.completion_prompts(req.prompt)
        if req.stream and len(prompts) != 1:
            raise RequestError("streaming supports a single prompt per request", "prompt")
        serving.check_prompt_sizes(prompts, self.max_prompt_chars, self.max_model_len)
        return await self.admitted(len(prompts), lambda: self._completions(request, req))

    async def _completions(self, request: Request, req: CompletionRequest) -> Response:
        jobs = await asyncio.to_thread(serving.completion_jobs, req, self.tokenize, self.max_model_len)
        rid = f"cmpl-{uuid.uuid4().hex}"
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return SSEResponse(self._stream_completion(jobs[0], rid, include_usage))

        outs = await self.finals(request, [(j.prompt_ids, j.params, f"{rid}-{j.index}") for j in jobs])
        if outs is None:
            return Response(status_code=499)
        choices = [serving.CompletionStream(j, self.text_of).full(o) for j, o in zip(jobs, outs)]
        usages = [serving.usage(o, j.hide_output, j.perf_metrics) for j, o in zip(jobs, outs)]
        perf = [u.perf_metrics for u in usages] if req.return_perf_metrics else None
        total = Usage(prompt_tokens=sum(u.prompt_tokens for u in usages),
                      completion_tokens=sum(u.completion_tokens for u in usages),
                      total_tokens=sum(u.total_tokens for u in usages),
                      perf_metrics=perf[0] if perf and len(perf) == 1 else perf)
        return _json(CompletionResponse(id=rid, model=self.model_name, choices=choices, usage=total))

    async def _stream_completion(self, job: serving.CompletionJob, rid: str, include_usage: bool):
        created = int(time.time())
        conv = serving.CompletionStream(job, self.text_of)
        last = None
        try:
            async for last in self.outputs(job.prompt_ids, job.params, rid):
                choice = conv.delta(last)
                if choice is not None:
                    yield _sse(CompletionResponse(id=rid, created=created, model=self.model_name, choices=[choice]))
        except (RuntimeError, RequestError) as exc:  # EngineRequestError, EngineDeadError
            yield _sse(_stream_error(exc))
        if include_usage and last is not None:
            yield _sse(CompletionResponse(id=rid, created=created, model=self.model_name, choices=[],
                                          usage=serving.usage(last, job.hide_output, job.perf_metrics)))
        yield "data: [DONE]\n\n"

    async def chat(self, request: Request) -> Response:
        req = await self.parse(request, ChatCompletionRequest)
        messages = serving.chat_messages(req)
        serving.check_chat_size(req, self.max_prompt_chars, self.max_model_len)
        return await self.admitted(1, lambda: self._chat(request, req, messages))

    def _chat_ids(self, req: ChatCompletionRequest, messages: list[dict]) -> list[int]:
        try:
            from tritongen.tokenizer import chat_prompt_ids

            return chat_prompt_ids(self.engine.tokenizer, messages, req.add_generation_prompt)
        except Exception as exc:  # jinja raise_exception(), missing template, bad roles
            raise RequestError(f"cannot apply the chat template: {exc}", "messages") from None

    async def _chat(self, request: Request, req: ChatCompletionRequest, messages: list[dict]) -> Response:
        ids = await asyncio.to_thread(self._chat_ids, req, messages)
        params = serving.chat_params(req, len(ids), self.max_model_len)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return SSEResponse(self._stream_chat(ids, params, rid, include_usage, req.return_perf_metrics))
        outs = await self.finals(request, [(ids, params, rid)])
        if outs is None:
            return Response(status_code=499)
        out = outs[0]
        logprobs = serving.chat_logprobs(self.text_of, out.logprobs) if out.logprobs is not None else None
        choice = ChatChoice(index=0, message=AssistantMessage(content=out.text), logprobs=logprobs,
                            finish_reason=out.finish_reason)
        return _json(ChatCompletionResponse(id=rid, model=self.model_name, choices=[choice],
                                            usage=serving.usage(out, perf=req.return_perf_metrics)))

    async def _stream_chat(self, ids: list[int], params: SamplingParams, rid: str, include_usage: bool,
                           perf: bool = False):
        created = int(time.time())

        def chunk(delta: DeltaMessage, finish=None, logprobs=None) -> str:
            choice = ChatChunkChoice(delta=delta, finish_reason=finish, logprobs=logprobs)
            return _sse(ChatCompletionChunk(id=rid, created=created, model=self.model_name, choices=[choice]))

        yield chunk(DeltaMessage(role="assistant", content=""))
        last = None
        try:
            async for last in self.outputs(ids, params, rid):
                lps = (serving.chat_logprobs(self.text_of, last.delta_logprobs)
                       if last.delta_logprobs else None)
                if last.delta_text or last.finished or lps:
                    yield chunk(DeltaMessage(content=last.delta_text), last.finish_reason, lps)
        except (RuntimeError, RequestError) as exc:  # EngineRequestError, EngineDeadError
            yield _sse(_stream_error(exc))
        if include_usage and last is not None:
            yield _sse(ChatCompletionChunk(id=rid, created=created, model=self.model_name, choices=[],
                                           usage=serving.usage(last, perf=perf)))
        yield "data: [DONE]\n\n"

    # -- the rest -----------------------------------------------------------------------------

    async def models(self, request: Request) -> Response:
        self.check_auth(request)
        return _json(ModelList(data=[ModelCard(id=self.model_name, max_model_len=self.engine.max_model_len)]))

    async def health(self, request: Request) -> Response:
        if self.engine.is_running:
            return Response("{}", media_type="application/json")
        return error_response(503, "the engine is not running", "service_unavailable", code="engine_unavailable")

    async def prometheus(self, request: Request) -> Response:
        update_engine_gauges(self.engine.stats(), self.metrics, self._counted)
        body, content_type = self.metrics.exposition()
        return Response(body, media_type=content_type)


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (the body was read before, so only http.disconnect comes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _bad_input_as_400(outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
    """The engine raises ValueError only for a request it refuses, before any output."""
    try:
        first = await outputs.__anext__()
    except StopAsyncIteration:
        return
    except ValueError as exc:
        raise RequestError(str(exc)) from None
    yield first
    async for out in outputs:
        yield out


def _describe(exc: ValidationError) -> tuple[str, Optional[str]]:
    """A readable message for a body that does not fit the schema, and the top-level field."""
    errors = exc.errors(include_url=False)
    parts = []
    for err in errors[:3]:
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    param = str(errors[0]["loc"][0]) if errors and errors[0]["loc"] else None
    return "invalid request body: " + "; ".join(parts), param


def _stream_error(exc: Exception) -> ErrorResponse:
    """An error after the stream started (engine failure): sent as one event before [DONE]."""
    if isinstance(exc, EngineDeadError):
        return ErrorResponse(error=ErrorInfo(message=str(exc), type="service_unavailable", code="engine_unavailable"))
    return ErrorResponse(error=ErrorInfo(message=str(exc), type="server_error", code="engine_error"))


def build_app(engine: AsyncLLM, *, served_model_name: Optional[str] = None, api_key: Optional[str] = None,
              max_queue: int = 4096, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
              max_num_seqs: Optional[int] = None) -> FastAPI:
    """The FastAPI app serving `engine`; the caller owns the engine (and shuts it down). At most
    max_num_seqs + max_queue engine requests are admitted at once (max_num_seqs: the engine's own
    when it runs in this process)."""
    name = served_model_name or model_name_for(None)
    server = OpenAIServer(engine, name, api_key, max_queue, max_num_seqs)
    app = FastAPI(title="tritongen OpenAI-compatible API", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    app.add_api_route("/v1/completions", server.completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", server.chat, methods=["POST"])
    app.add_api_route("/v1/models", server.models, methods=["GET"])
    app.add_api_route("/health", server.health, methods=["GET"])
    app.add_api_route("/metrics", server.prometheus, methods=["GET"])

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, exc: RequestError) -> Response:
        return error_response(exc.status, exc.message, exc.type, exc.param, exc.code)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return error_response(exc.status_code, str(exc.detail), code=str(exc.status_code))

    @app.exception_handler(EngineDeadError)
    async def _engine_dead(request: Request, exc: EngineDeadError) -> Response:
        return error_response(503, str(exc), "service_unavailable", code="engine_unavailable")

    @app.exception_handler(EngineRequestError)
    async def _engine_request_failed(request: Request, exc: EngineRequestError) -> Response:
        logger.warning("request failed in the engine: %s", exc)  # the engine logged the traceback
        return error_response(500, f"engine error: {exc}", "server_error", code="engine_error")

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        logger.exception("internal error on %s", request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}", "server_error")

    app.add_middleware(BodyLimit, limit=max_body_bytes)
    return app


def model_name_for(model: Optional[str]) -> str:
    """The name clients send as `model`: `dummy:<preset>` as given, a directory's last part, or
    the default model's name."""
    from pathlib import Path

    from tritongen.config import DEFAULT_MODEL

    if not model:
        return DEFAULT_MODEL
    return model if model.startswith("dummy:") else Path(model.rstrip("/")).name
