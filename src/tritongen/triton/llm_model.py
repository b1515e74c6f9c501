"""Body of the decoupled `llm` model: one instance hosts an AsyncLLM.

`execute` hands each request to an asyncio loop thread and returns at once; the request's task
starts it and waits for its end. In between, its outputs reach its response sender without waking
the task (triton/streams.py): each engine step's one callback on the loop hands every request its
output (AsyncLLM.open), and sends complete in batches. Everything that talks to the server process
is a blocking round trip (python_backend 24.10: a send, a cancellation check, a metric update),
and none of it runs on the loop, which must read every step of every request:
- sends run on a few sender threads (triton/responses.py): sends of different requests overlap,
  and a request whose previous send is still in flight gets the steps it missed merged into its
  next response instead of queueing one per token;
- a request's metric updates are recorded where they happen and applied off the loop, with
  everyone's pending ones, counters of one series summed (responses.flush_metrics): by the
  watcher every CANCEL_POLL_S and in the sender thread before a FINAL (so a client that saw the
  FINAL sees its request counted); a streamed send makes no metric round trip;
- a watcher thread polls the senders for cancellation (gRPC stream cancel, client disconnect),
  each request every CANCEL_POLL_S, and aborts the engine request. In the server each check is
  served by the one thread that dispatches every message of the stub, sends included: the checks
  are spread out, never a burst of one per request.
Streamed responses are built with a TensorCache: a text piece or token count already sent goes out
again as the same pb_utils.Tensor (python_backend reuses its shared-memory copy).
Every request ends with exactly one response carrying the FINAL flag (data, error, or CANCELLED).
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, replace
from typing import Optional

from tritongen.config import DEFAULT_MAX_QUEUE, EngineConfig
from tritongen.metrics import RequestTimer, update_engine_gauges
from tritongen.triton import codec, control, errors
from tritongen.triton.control import CANCEL_POLL_S
from tritongen.triton.loop import LoopThread
from tritongen.triton.responses import METRICS_LOCK, MetricOps, SendThreads, TensorCache, flush_metrics, send_on
from tritongen.triton.metric_families import TritonMetricsSink
from tritongen.triton.streams import ResponseStream
from tritongen.triton.repo import parameter_value
from tritongen.triton.trtllm import PerfMetrics

logger = logging.getLogger(__name__)

_WATCH_INTERVAL_S = 0.05  # how often the drain file is looked for


def default_sender_threads(max_num_seqs: int) -> int:
    """Concurrent response sends when `sender_threads` is unset: an eighth of the engine's batch,
    within [8, 32]. A send blocks its thread for one round trip to the server (~1-2 ms under load)
    and each stream has at most one send in flight, so 8 threads capped a stub near 8 / round trip
    responses a second: a stream got one response per two to four steps at 512 streams. More
    than 32 threads measured no better (docs/benchmarks.md, Triton streaming responses)."""
    return min(32, max(8, max_num_seqs // 8))


@dataclass
class _Active:
    sender: object
    task: asyncio.Task
    client_id: str
    """The request id the client (or a forwarding model) gave."""


class TritonPythonModel:
    _poll_cond = threading.Condition()
    """Guards _polling; notified when a check ends (initialize gives each instance its own)."""
    _polling: object = None
    """The sender being asked is_cancelled() now, if any: its FINAL send waits for the check to end
    (see _final); the FINALs of other requests do not."""

    def initialize(self, args: dict) -> None:
        import triton_python_backend_utils as pb_utils

        from tritongen.triton.repo import engine_kwargs_from_config

        self.pb = pb_utils
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(f"model {args['model_name']} must be decoupled "
                                                "(model_transaction_policy { decoupled: true })")
        self.batch_dim = config.get("max_batch_size", 0) > 0
        self.stream_interval = stream_interval(config.get("parameters", {}))
        self.max_queue = max_queue(config.get("parameters", {}))
        kwargs = engine_kwargs_from_config(config.get("parameters", {}))
        engine_config = EngineConfig.from_kwargs(**kwargs)
        self.max_num_seqs = engine_config.scheduler.max_num_seqs
        self.sender_threads = positive_parameter(config.get("parameters", {}), "sender_threads",
                                                 default_sender_threads(self.max_num_seqs))
        self.block_size = engine_config.cache.block_size
        self.engine = self._start_engine(kwargs)
        self._closing = False
        self._control_token = control.publish_token(args["model_name"])
        self._model_name = args["model_name"]
        sink = TritonMetricsSink(pb_utils, {"model": args["model_name"], "version": args["model_version"]})
        self.metrics = _UnlessClosing(sink, self)
        self._drain_file = os.environ.get(control.DRAIN_FILE_ENV) or None
        self._counted: dict[str, float] = {}  # engine counters already exported
        self._ids = itertools.count()
        self._active: dict[str, _Active] = {}
        self._senders = SendThreads(self.sender_threads, "tritongen-send")
        self._poll_cond = threading.Condition()
        self.loop = LoopThread(f"tritongen-{args['model_name']}")
        self.loop.submit(self._watch())
        threading.Thread(target=self._poll_cancellation, name="tritongen-cancel", daemon=True).start()

    @functools.cached_property
    def _tensors(self) -> TensorCache:
        """Streamed responses are built with this (tensors of repeated values are sent again)."""
        return TensorCache(self.pb)

    def _start_engine(self, kwargs: dict):
        """The AsyncLLM this model serves (benchmarks/stub_responses.py puts a paced engine here)."""
        from tritongen.entrypoints.async_engine import AsyncLLM

        return AsyncLLM(**kwargs)

    def execute(self, requests: list) -> None:
        for request in requests:
            self.loop.submit(self._serve(request))
        return None

    def finalize(self) -> None:
        self._closing = True  # in-flight requests end UNAVAILABLE ("shutting down"), not CANCELLED
        self.loop.stop()  # cancels in-flight requests: each aborts its engine request and ends FINAL
        self._senders.shutdown()
        self.engine.shutdown()
        control.remove_token(self._model_name)

    # -- one request --------------------------------------------------------------------------

    async def _serve(self, request) -> None:
        arrival_ns = time.time_ns()
        sender = request.get_response_sender()
        tag = codec.wants_tagged_errors(request)
        ops = MetricOps(self.metrics)
        try:
            parsed = self._admit(request)
        except codec.InvalidInput as exc:
            await self._final(sender, errors.error_response(self.pb, str(exc), tag=tag))
            return
        except _Rejected as exc:
            if exc.full:
                ops.increment("tritongen_request_rejected_total", 1)
            await self._final(sender, errors.error_response(self.pb, str(exc), "UNAVAILABLE", tag), ops=ops)
            return
        except Exception as exc:  # a bug of ours: the request still ends, with the cause
            logger.exception("reading a request failed")
            await self._final(sender, errors.error_response(self.pb, f"internal error: {exc!r}", "INTERNAL", tag))
            return
        if isinstance(parsed, str):
            await self._abort_by_client_id(parsed)
            await self._final(sender, self.pb.InferenceResponse(output_tensors=[]))
            return
        client_id = request.request_id()
        request_id = f"{client_id or 'triton'}-{next(self._ids)}"
        self._active[request_id] = _Active(sender, asyncio.current_task(), client_id)
        timer = RequestTimer()
        try:
            await self._generate(request_id, parsed, sender, timer, PerfMetrics(arrival_ns), ops)
        except asyncio.CancelledError:
            await self.engine.abort(request_id)  # blocks are free when this returns
            timer.on_end("abort", ops)  # the sink is silent once closing (_UnlessClosing)
            response = (errors.error_response(self.pb, "the server is shutting down", "UNAVAILABLE", tag)
                        if self._closing else errors.error_response(self.pb, "request cancelled", "CANCELLED", tag))
            await self._final(sender, response, request_id, ops)
        except Exception as exc:
            code = errors.error_code_for(exc)
            if code == "INTERNAL":
                logger.exception("request %s failed", request_id)
            if code != "INVALID_ARG":
                timer.on_end("error", ops)
            await self._final(sender, errors.error_response(self.pb, str(exc), code, tag), request_id, ops)
        finally:
            self._active.pop(request_id, None)

    def _admit(self, request):
        """The request's ParsedRequest, or the client id a valid control request names. Raises
        InvalidInput (bad input, a control request without the token) or _Rejected (engine down,
        queue full)."""
        target = codec.abort_target(request, self.pb)
        if target is not None:
            if not control.is_valid(codec.request_parameter(request, control.TOKEN_PARAMETER), self._control_token):
                raise codec.InvalidInput("input 'abort_request_id' is reserved for tritongen's forwarding models")
            return target
        parsed = codec.parse_request(request, self.pb)
        if self._closing:
            raise _Rejected("the server is shutting down")
        if not self.engine.is_running:
            raise _Rejected("the engine is not running (restarting); retry later")
        if self.max_queue and len(self._active) >= self.max_num_seqs + self.max_queue:
            raise _Rejected(f"the queue is full ({len(self._active)} requests in flight, max_queue "
                            f"{self.max_queue} beyond max_num_seqs {self.max_num_seqs}); retry later", full=True)
        return parsed

    async def _generate(self, request_id: str, parsed: codec.ParsedRequest, sender,
                        timer: Optional[RequestTimer] = None, perf: Optional[PerfMetrics] = None,
                        ops: Optional[MetricOps] = None) -> None:
        timer = timer or RequestTimer()
        perf = perf or PerfMetrics(time.time_ns())
        ops = ops if ops is not None else MetricOps(self.metrics)
        decode = self._decode if parsed.outputs.logprobs else None
        stream = ResponseStream(self, parsed, sender, timer, perf, ops, decode, EngineRequestError)
        outputs = self.engine.open(parsed.prompt, self._with_stop_sequences(parsed), request_id, stream.on_item)
        try:
            out = await stream.done
            await stream.settled()
        finally:
            outputs.close()  # before the end (cancelled, failed): aborts the engine request
            await stream.settled(raise_error=False)  # one send at a time per sender: the FINAL follows
        response = codec.make_response(out, parsed, self.pb, batch_dim=self.batch_dim, decode=decode, perf=perf)
        await self._final(sender, response, request_id, ops)

    def _with_stop_sequences(self, parsed: codec.ParsedRequest):
        """Multi-token stop words (stop_words_list) end generation where their text appears."""
        if not parsed.stop_sequences:
            return parsed.params
        words = [self.engine.tokenizer.decode(ids) for ids in parsed.stop_sequences]
        params = replace(parsed.params, stop=list(parsed.params.stop) + [w for w in words if w])
        try:
            params.validate()
        except ValueError as exc:
            raise codec.InvalidInput(f"input 'stop_words_list': {exc}") from None
        return params

    async def _abort_by_client_id(self, client_id: str) -> None:
        """Control request from a forwarding model (llm_bls) whose own client cancelled: BLS in
        python_backend 24.10 has no way to cancel an inner request, so it names it here (with the
        token of triton/control.py: no client can send one)."""
        for request_id, active in list(self._active.items()):
            if client_id and active.client_id == client_id:
                del self._active[request_id]
                active.task.cancel()
                await asyncio.gather(active.task, return_exceptions=True)  # its blocks are free after this

    def _decode(self, token_id: int) -> str:
        return self.engine.tokenizer.decode([token_id])

    async def _send(self, call: functools.partial) -> None:
        sending = send_on(self._senders, call)
        try:
            await asyncio.shield(sending)
        except asyncio.CancelledError:
            await asyncio.gather(sending, return_exceptions=True)  # one send at a time per sender
            raise

    async def _final(self, sender, response, request_id: Optional[str] = None,
                     ops: Optional[MetricOps] = None) -> None:
        if request_id is not None:
            # Before the FINAL send, not after: the watcher must never poll a closed sender
            # (python_backend frees its response factory; TRITONBACKEND_ResponseFactoryIsCancelled
            # then crashes the server). A check of this sender already under way: the FINAL
            # waits for it (in the sender thread, never on the loop).
            self._active.pop(request_id, None)
        flag = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        await self._send(functools.partial(self._send_final, ops, sender, response, flag))

    def _send_final(self, ops: Optional[MetricOps], sender, response, flag: int) -> None:
        if ops is not None:
            ops.apply()
        with self._poll_cond:
            while self._polling is sender:
                self._poll_cond.wait()
        errors.send_final(sender, response, flag)

    # -- background ---------------------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(_WATCH_INTERVAL_S)
            if not self._closing and self._drain_file and os.path.exists(self._drain_file):
                self._drain()

    def _poll_cancellation(self) -> None:
        """Watcher thread: ask every request in flight whether its client cancelled, spread over
        CANCEL_POLL_S (a cancelled one is cancelled on the loop); then update the gauges."""
        while not self._closing:
            self._update_gauges()
            started = time.monotonic()
            snapshot = list(self._active.items())
            for k, (request_id, active) in enumerate(snapshot):
                ahead = started + k * CANCEL_POLL_S / len(snapshot) - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)  # evenly spread; a pass that runs late never waits
                if self._is_cancelled(request_id, active):
                    try:
                        self.loop.loop.call_soon_threadsafe(self._cancel_polled, request_id, active)
                    except RuntimeError:
                        return  # the loop is closed: the model is going away
            time.sleep(max(0.0, CANCEL_POLL_S - (time.monotonic() - started)) if snapshot else _WATCH_INTERVAL_S)

    def _is_cancelled(self, request_id: str, active: _Active) -> bool:
        with self._poll_cond:
            if self._active.get(request_id) is not active:
                return False  # ended meanwhile: its sender may be closed
            self._polling = active.sender
        try:
            return bool(active.sender.is_cancelled())
        except Exception:
            return False
        finally:
            with self._poll_cond:
                self._polling = None
                self._poll_cond.notify_all()

    def _cancel_polled(self, request_id: str, active: _Active) -> None:
        if self._active.get(request_id) is active:
            del self._active[request_id]  # cancel once: the task's cleanup must not be interrupted
            active.task.cancel()

    def _drain(self) -> None:
        """The server is stopping: refuse new requests, end every one in flight (UNAVAILABLE)."""
        logger.info("the server is stopping: ending %d requests in flight", len(self._active))
        self._closing = True
        for request_id, active in list(self._active.items()):
            del self._active[request_id]
            active.task.cancel()

    def _update_gauges(self) -> None:
        try:
            flush_metrics()  # the requests' deferred updates (TTFT), so they lag by CANCEL_POLL_S at most
            with METRICS_LOCK:
                update_engine_gauges(self.engine.stats(), self.metrics, self._counted)
        except Exception:
            logger.debug("gauge update failed", exc_info=True)


class _UnlessClosing:
    """The metrics sink, silent once the model is closing: every update is a blocking round trip
    to the server, and a server that is stopping may never answer (python_backend waits without a
    timeout), which would hang the thread that made it and the unload behind it."""

    def __init__(self, sink, model: "TritonPythonModel") -> None:
        self._sink, self._model = sink, model

    def observe(self, name: str, value: float) -> None:
        if not self._model._closing:
            self._sink.observe(name, value)

    def increment(self, name: str, value: float, labels: Optional[dict] = None) -> None:
        if not self._model._closing:
            self._sink.increment(name, value, labels)

    def set_gauge(self, name: str, value: float) -> None:
        if not self._model._closing:
            self._sink.set_gauge(name, value)


class _Rejected(Exception):
    """The request is refused before it reaches the engine (UNAVAILABLE: retry later); `full`:
    because the queue is full (counted in tritongen_request_rejected_total)."""

    def __init__(self, message: str, full: bool = False) -> None:
        super().__init__(message)
        self.full = full


class EngineRequestError(RuntimeError):
    """The engine ended this request with an error of its own (INTERNAL); other requests go on."""


def max_queue(parameters: dict) -> int:
    """Requests allowed to wait beyond max_num_seqs running (model parameter `max_queue`; 0 = no
    bound). More are refused at once with UNAVAILABLE instead of queueing without limit."""
    raw = parameter_value(parameters["max_queue"]) if "max_queue" in parameters else ""
    try:
        value = int(raw or DEFAULT_MAX_QUEUE)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"max_queue must be a non-negative integer, got {raw!r}")
    return value


def stream_interval(parameters: dict) -> int:
    """Tokens per streamed response (model parameter `stream_interval`, default 1). Each response
    costs the stub process Python time under the GIL that the engine thread shares; sending every
    Nth token (the final response carries the rest) divides that cost by N."""
    return positive_parameter(parameters, "stream_interval", 1)


def positive_parameter(parameters: dict, name: str, default: int) -> int:
    """A positive integer model parameter (`sender_threads`: concurrent response sends, each
    blocking its thread for one round trip to the server), or `default` when unset."""
    raw = (parameter_value(parameters[name]) if name in parameters else "") or str(default)
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {raw!r}")
    return value
