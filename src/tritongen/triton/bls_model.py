"""Body of the forwarding models: `llm_bls`, `fastertransformer`, `tensorrt_llm` (the ensemble's
token step), `llm_tokens` and `tensorrt_llm_bls`.

They hold no engine: each request goes on to the decoupled engine model (parameter llm_model)
through BLS `exec(decoupled=True)`. One instance serves many requests at once: `execute` hands
each request to an asyncio loop thread and returns None, and the answers go out through the
response sender. The model parameter `layout` (layouts.py) says which client vocabulary it speaks.
- Non-decoupled models answer once: `llm_bls` (no batch dimension) and the batched
  `fastertransformer` and `tensorrt_llm`. A batch of B rows becomes B engine requests, run at once;
  the answer pads their outputs back into one batch (a row equals the same prompt sent alone).
- Decoupled models (`llm_tokens`, `tensorrt_llm_bls`) stream when `stream` / `streaming` is true
  (one prompt per request then), every engine response forwarded with the batch dimension added;
  otherwise they answer once, batches included.

BLS calls block, so each runs in a worker thread. When the outer request is cancelled, the
inner one is cancelled by a control request naming it (abort_request_id, with the engine model's
secret token: triton/control.py): python_backend 24.10 cannot cancel a BLS request otherwise.
When the engine model's stub process dies, python_backend never answers the inner requests: the
watcher sees the process gone and ends every request in flight with UNAVAILABLE at once.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import json
import logging
import os
import threading
import time

import numpy as np

from tritongen.triton import codec, control, errors, layouts
from tritongen.triton.codec import TensorSpec
from tritongen.triton.loop import LoopThread

logger = logging.getLogger(__name__)

_MAX_IN_FLIGHT = 1024  # worker threads, each blocked on one inner request
_WATCH_INTERVAL_S = 0.05
_ENGINE_CHECK_S = 0.5  # how often the engine model's process is checked while requests are in flight
_HOLD_S = 5.0  # how long a finished BLS request and its response iterator are kept alive


class _Held:
    """Finished BLS requests and their response iterators, kept alive `hold_s` longer and then let
    go by a later request's worker thread, not the moment they finish. python_backend 24.10's stub
    crashed (segfault, heap corruption) with hundreds of BLS requests in flight when they were freed
    at once: in the response iterator of a BLS worker thread, or with no Python frame on the loop
    thread that dropped the request (docs/reliability.md, Upstream: 4 of 7 runs of
    `benchmarks/bls_stress.py --concurrency 512 --rounds 3` before, 0 of 10 since)."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self._items: collections.deque = collections.deque()
        self._lock = threading.Lock()

    def keep(self, *objects) -> None:
        now = time.monotonic()
        with self._lock:
            self._items.append((now, objects))
            while now - self._items[0][0] > self.hold_s:
                self._items.popleft()


_HELD = _Held(_HOLD_S)


class TritonPythonModel:
    FAULT_ALL_THREADS = False
    """model.py's faulthandler dumps only the faulting thread: with hundreds of BLS worker threads
    the all-threads dump stops at faulthandler's 100 and missed the faulting one (seen at 512
    requests in flight)."""

    def initialize(self, args: dict) -> None:
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        self.name = args["model_name"]
        self.target = params.get("llm_model", {}).get("string_value", "llm")
        self.streaming = pb_utils.using_decoupled_model_transaction_policy(config)
        self.batch_dim = config.get("max_batch_size", 0) > 0
        self.layout = params.get("layout", {}).get("string_value") or ("trtllm" if self.batch_dim else "vllm")
        if self.layout not in layouts.LAYOUTS:
            raise pb_utils.TritonModelException(f"model {self.name}: parameter layout must be one of "
                                                f"{', '.join(layouts.LAYOUTS)}, got {self.layout!r}")
        self.all_outputs = params.get("all_outputs", {}).get("string_value") == "true"
        self.outputs = [TensorSpec(o["name"], o["data_type"], tuple(o.get("dims", ()))) for o in config.get("output", [])]
        self.output_names = [o.name for o in self.outputs]
        self.pool = concurrent.futures.ThreadPoolExecutor(_MAX_IN_FLIGHT, thread_name_prefix="tritongen-bls")
        self._prefix = f"{self.name}-{os.getpid()}-"
        self._ids = itertools.count()
        self._active: dict[str, tuple[object, asyncio.Task, int]] = {}  # sender, task, sequence number
        self._unavailable: set[str] = set()  # requests ended because the engine model's stub died
        self.loop = LoopThread(f"tritongen-{self.name}")
        self.loop.submit(self._watch())

    def execute(self, requests: list) -> None:
        for request in requests:
            self.loop.submit(self._serve(request))
        return None

    def finalize(self) -> None:
        self.loop.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def _serve(self, request) -> None:
        sender = request.get_response_sender()
        seq = next(self._ids)
        request_id = f"{self._prefix}{seq}"
        loop = asyncio.get_running_loop()
        try:
            rows, stream, pad = self._inner_requests(request, request_id)
        except Exception as exc:
            if isinstance(exc, codec.InvalidInput):
                response = errors.error_response(self.pb, str(exc))
            else:
                logger.exception("reading a request failed")
                response = errors.error_response(self.pb, f"internal error: {exc!r}", "INTERNAL")
            await loop.run_in_executor(self.pool, self._final, sender, response)
            return
        self._active[request_id] = (sender, asyncio.current_task(), seq)
        if stream:
            job = loop.run_in_executor(self.pool, self._forward_stream, rows[0][1], sender)
        else:  # every row at once: each is its own engine request
            job = asyncio.gather(*(loop.run_in_executor(self.pool, self._run_row, inner) for _, inner in rows))
        try:
            results = await asyncio.shield(job)
            response = results if stream else self._merge(results, pad)
        except asyncio.CancelledError:
            if request_id in self._unavailable:  # nobody will answer the inner requests: don't wait
                self._unavailable.discard(request_id)
                response = errors.error_response(self.pb, f"model '{self.target}' stopped while serving this "
                                                "request (its process died); retry later", "UNAVAILABLE")
            else:
                for row_id, _ in rows:
                    await loop.run_in_executor(self.pool, self._abort_inner, row_id)
                await asyncio.gather(job, return_exceptions=True)  # the inner requests end CANCELLED
                response = errors.error_response(self.pb, "request cancelled", "CANCELLED")
        except Exception as exc:
            logger.exception("forwarding to %s failed", self.target)
            response = errors.error_response(self.pb, f"forwarding to {self.target} failed: {exc}",
                                            errors.forward_error_code(str(exc)))
        finally:
            self._active.pop(request_id, None)  # before the FINAL: the watcher must not poll it after
        await loop.run_in_executor(self.pool, self._final, sender, response)  # a blocking round trip

    def _inner_requests(self, request, request_id: str):
        """([(row request id, inner request)], stream, output_ids pad value): one engine request
        per batch row. Raises InvalidInput naming the input that cannot be forwarded."""
        arrays = {t.name(): t.as_numpy() for t in request.inputs()}
        rows = _split_rows(arrays) if self.batch_dim else [arrays]
        stream = any(_true(row.get(n)) for row in rows for n in ("stream", "streaming"))
        if stream and not self.streaming:
            if self.layout != "vllm":  # llm_bls has always answered once, whatever `stream` said
                name = "streaming" if any("streaming" in row for row in rows) else "stream"
                raise codec.InvalidInput(f"input '{name}' is true but model '{self.name}' answers once (not "
                                         "decoupled); stream from llm_tokens or tensorrt_llm_bls")
            stream = False
        if stream and len(rows) > 1:
            raise codec.InvalidInput(f"streaming takes one prompt per request; this one holds {len(rows)}")
        parameters = {**_parameters(request), errors.TAG_ERRORS: True}
        if self.layout == "trtllm":
            parameters[codec.LAYOUT_PARAMETER] = "trtllm"
        names = list(request.requested_output_names()) if self.layout == "vllm" else []
        names = [n for n in (names or self.output_names) if n in layouts.ENGINE_OUTPUT_NAMES]
        inner = []
        for i, row in enumerate(rows):
            row_id = request_id if len(rows) == 1 else f"{request_id}.{i}"
            inner.append((row_id, self.pb.InferenceRequest(
                model_name=self.target, inputs=self._row_inputs(row, stream), request_id=row_id,
                requested_output_names=names, parameters=parameters)))
        end_id = rows[0].get("end_id") if rows else None
        return inner, stream, int(np.asarray(end_id).reshape(-1)[0]) if end_id is not None and end_id.size else 0

    def _row_inputs(self, row: dict, stream: bool) -> list:
        inputs = []
        for name, array in row.items():
            if name in ("stream", "streaming"):
                continue
            cast = layouts.engine_row(name, array)
            if cast is None:
                raise codec.InvalidInput(f"input '{name}' holds a value out of the range of "
                                         f"{layouts.ENGINE_INPUT_TYPES[name].__name__}")
            inputs.append(self.pb.Tensor(name, cast))
        inputs.append(self.pb.Tensor("stream", np.array([stream], dtype=bool)))
        if self.layout == "fastertransformer" and "exclude_input_in_output" not in row:
            inputs.append(self.pb.Tensor("exclude_input_in_output", np.array([False], dtype=bool)))  # FT echoed
        return inputs

    def _inner_error(self, response):
        raw = response.error().message()
        code, message = errors.untag_error(raw)
        if message == raw:  # not from the engine model: Triton's own (model not ready, ...)
            code = errors.forward_error_code(message)
        return errors.error_response(self.pb, message, code)

    def _run_row(self, inner):
        """Blocking: one row to its end; its last data outputs ({name: array}) or an error response."""
        last = collections.deque(maxlen=1)
        error = self._exec(inner, last.append)
        if error is not None:
            return error
        return last[0] if last else errors.error_response(self.pb, f"{self.target} sent no response", "INTERNAL")

    def _forward_stream(self, inner, sender):
        """Blocking: send every data response of one streamed row on at once; None, or the error response."""
        return self._exec(inner, lambda outputs: sender.send(self._merge([outputs], 0)))

    def _exec(self, inner, on_outputs):
        """Blocking: run one inner request to its end, handing on_outputs each data response's outputs
        ({name: array}); None, or the error response that ended it. The request and its response
        iterator are kept alive a while longer (_HELD)."""
        responses = inner.exec(decoupled=True)
        try:
            for response in responses:
                if response.has_error():
                    return self._inner_error(response)
                if response.output_tensors():
                    on_outputs({t.name(): t.as_numpy() for t in response.output_tensors()})
        finally:
            _HELD.keep(inner, responses)
        return None

    def _merge(self, rows: list, pad: int):
        """The rows' outputs as one response (the first error response, if a row failed)."""
        for row in rows:
            if not isinstance(row, dict):
                return row
        if not self.batch_dim:
            return self.pb.InferenceResponse(output_tensors=[self.pb.Tensor(n, a) for n, a in rows[0].items()])
        tensors = []
        for spec in self.outputs:
            if all(spec.name in row for row in rows):
                array = layouts.stack_rows(spec.name, [row[spec.name] for row in rows],
                                           layouts.NUMPY_TYPES[spec.data_type], pad if spec.name == "output_ids" else 0)
            elif self.all_outputs:
                array = layouts.empty_output(spec, len(rows))
            else:
                continue
            tensors.append(self.pb.Tensor(spec.name, array))
        return self.pb.InferenceResponse(output_tensors=tensors)

    def _abort_inner(self, request_id: str) -> None:
        pb = self.pb
        token = control.read_token(self.target)
        if token is None:
            return  # the engine model is not loaded: nothing to abort
        abort = pb.InferenceRequest(
            model_name=self.target, requested_output_names=[],
            inputs=[pb.Tensor("abort_request_id", np.array([request_id.encode()], dtype=np.object_))],
            parameters={control.TOKEN_PARAMETER: token})
        for _ in abort.exec(decoupled=True):
            pass

    def _final(self, sender, response) -> None:
        errors.send_final(sender, response, self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    async def _watch(self) -> None:
        ticks_per_check = max(1, round(_ENGINE_CHECK_S / _WATCH_INTERVAL_S))
        # each request every CANCEL_POLL_S: on one tick of every round (by its sequence number)
        ticks_per_poll = max(1, round(control.CANCEL_POLL_S / _WATCH_INTERVAL_S))
        for tick in itertools.count():
            await asyncio.sleep(_WATCH_INTERVAL_S)
            engine_gone = tick % ticks_per_check == 0 and bool(self._active) and not self._engine_alive()
            for request_id, (sender, task, seq) in list(self._active.items()):
                if engine_gone:
                    cancelled = False
                elif seq % ticks_per_poll != tick % ticks_per_poll:
                    continue  # its turn is another tick of this round
                else:
                    try:
                        cancelled = sender.is_cancelled()
                    except Exception:
                        cancelled = False
                if cancelled or engine_gone:
                    del self._active[request_id]
                    if engine_gone and not cancelled:
                        self._unavailable.add(request_id)
                    task.cancel()

    def _engine_alive(self) -> bool:
        """False when the engine model's stub process has died (the supervisor reloads it)."""
        pid = control.engine_pid(self.target)
        return pid is None or control.process_alive(pid)


def _split_rows(arrays: dict) -> list[dict]:
    """{name: [B, ...]} -> B rows of {name: [...]}; every input must have the same batch size."""
    sizes = {name: array.shape[0] if array.ndim else 0 for name, array in arrays.items()}
    if len(set(sizes.values())) > 1:
        shown = ", ".join(f"'{n}' {b}" for n, b in sizes.items())
        raise codec.InvalidInput(f"the inputs differ in batch size ({shown}); every input needs one row per prompt")
    batch = next(iter(sizes.values()), 0)
    return [{name: array[i] for name, array in arrays.items()} for i in range(batch)]


def _true(array) -> bool:
    return array is not None and bool(np.asarray(array).reshape(-1)[:1].any())


def _parameters(request) -> dict:
    """Request parameters (HTTP /generate "parameters") travel on to the engine model."""
    raw = request.parameters() if hasattr(request, "parameters") else "{}"
    try:
        params = json.loads(raw) if isinstance(raw, str) else dict(raw or {})
    except json.JSONDecodeError:
        return {}
    return {k: v for k, v in params.items() if not k.startswith(("triton_", "tritongen_"))}
