"""Body of the forwarding models: `llm_bls` and the ensemble's token step.

They hold no engine: each request goes on to the decoupled engine model (parameter llm_model)
through BLS `exec(decoupled=True)`.
- `llm_bls` (non-decoupled, max_batch_size 0) is for clients that cannot stream. It answers with
  one response. One instance serves many requests at once: `execute` hands each request to an
  asyncio loop thread and returns None, and the answer goes out through the response sender.
- `<name>_tokens` (decoupled, max_batch_size > 0) is the ensemble's middle step, shaped like
  TensorRT-LLM's tensorrt_llm model: it strips the batch dimension, forwards every response of
  the engine model, and adds the batch dimension back.

BLS calls block, so each runs in a worker thread. When the outer request is cancelled, the
inner one is cancelled by a control request naming it (abort_request_id, with the engine model's
secret token: triton/control.py): python_backend 24.10 cannot cancel a BLS request otherwise.
When the engine model's stub process dies, python_backend never answers the inner requests: the
watcher sees the process gone and ends every request in flight with UNAVAILABLE at once.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import logging
import os

import numpy as np

from tritongen.triton import codec, control
from tritongen.triton.loop import LoopThread

logger = logging.getLogger(__name__)

_MAX_IN_FLIGHT = 1024  # worker threads, each blocked on one inner request
_WATCH_INTERVAL_S = 0.05
_ENGINE_CHECK_S = 0.5  # how often the engine model's process is checked while requests are in flight


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        self.target = params.get("llm_model", {}).get("string_value", "llm")
        self.streaming = pb_utils.using_decoupled_model_transaction_policy(config)
        self.batch_dim = config.get("max_batch_size", 0) > 0
        self.output_names = [o["name"] for o in config.get("output", [])]
        self.pool = concurrent.futures.ThreadPoolExecutor(_MAX_IN_FLIGHT, thread_name_prefix="tritongen-bls")
        self._prefix = f"{args['model_name']}-{os.getpid()}-"
        self._ids = itertools.count()
        self._active: dict[str, tuple[object, asyncio.Task]] = {}
        self._unavailable: set[str] = set()  # requests ended because the engine model's stub died
        self.loop = LoopThread(f"tritongen-{args['model_name']}")
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
        request_id = f"{self._prefix}{next(self._ids)}"
        loop = asyncio.get_running_loop()
        try:
            inner = self._inner_request(request, request_id)
        except Exception as exc:
            if isinstance(exc, codec.InvalidInput):
                response = codec.error_response(self.pb, str(exc))
            else:
                logger.exception("reading a request failed")
                response = codec.error_response(self.pb, f"internal error: {exc!r}", "INTERNAL")
            await loop.run_in_executor(self.pool, self._final, sender, response)
            return
        self._active[request_id] = (sender, asyncio.current_task())
        job = loop.run_in_executor(self.pool, self._forward, inner, sender)
        try:
            response = await asyncio.shield(job)
        except asyncio.CancelledError:
            if request_id in self._unavailable:  # nobody will answer the inner request: don't wait
                self._unavailable.discard(request_id)
                response = codec.error_response(self.pb, f"model '{self.target}' stopped while serving this "
                                                "request (its process died); retry later", "UNAVAILABLE")
            else:
                await loop.run_in_executor(self.pool, self._abort_inner, request_id)
                await asyncio.gather(job, return_exceptions=True)  # the inner request ends CANCELLED
                response = codec.error_response(self.pb, "request cancelled", "CANCELLED")
        except Exception as exc:
            logger.exception("forwarding to %s failed", self.target)
            response = codec.error_response(self.pb, f"forwarding to {self.target} failed: {exc}",
                                            codec.forward_error_code(str(exc)))
        finally:
            self._active.pop(request_id, None)  # before the FINAL: the watcher must not poll it after
        await loop.run_in_executor(self.pool, self._final, sender, response)  # a blocking round trip

    def _inner_request(self, request, request_id: str):
        pb = self.pb
        inputs = []
        for tensor in request.inputs():
            array = tensor.as_numpy()
            if self.batch_dim:
                if array.shape[0] != 1:
                    raise codec.InvalidInput(f"input '{tensor.name()}' has batch size {array.shape[0]}; "
                                             "send one request per prompt (batch size 1)")
                array = array[0]
            if tensor.name() != "stream" or self.streaming:
                inputs.append(pb.Tensor(tensor.name(), array))
        if not self.streaming:
            inputs.append(pb.Tensor("stream", np.array([False], dtype=bool)))  # one answer: never stream
        names = list(request.requested_output_names()) or self.output_names
        return pb.InferenceRequest(model_name=self.target, inputs=inputs, request_id=request_id,
                                   requested_output_names=names,
                                   parameters={**_parameters(request), codec.TAG_ERRORS: True})

    def _forward(self, inner, sender):
        """Blocking: run the inner request to its end. Streaming, every data response is sent on at
        once and None is returned; else the last data (or the error) response is returned."""
        last = None
        for response in inner.exec(decoupled=True):
            if response.has_error():
                raw = response.error().message()
                code, message = codec.untag_error(raw)
                if message == raw:  # not from the engine model: Triton's own (model not ready, ...)
                    code = codec.forward_error_code(message)
                return codec.error_response(self.pb, message, code)
            if not response.output_tensors():
                continue
            last = self._outer_response(response)
            if self.streaming:
                sender.send(last)
        if self.streaming:
            return None
        return last or codec.error_response(self.pb, f"{self.target} sent no response", "INTERNAL")

    def _outer_response(self, response):
        tensors = response.output_tensors()
        if self.batch_dim:
            tensors = [self.pb.Tensor(t.name(), t.as_numpy()[np.newaxis]) for t in tensors]
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
        codec.send_final(sender, response, self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    async def _watch(self) -> None:
        ticks_per_check = max(1, round(_ENGINE_CHECK_S / _WATCH_INTERVAL_S))
        for tick in itertools.count():
            await asyncio.sleep(_WATCH_INTERVAL_S)
            engine_gone = tick % ticks_per_check == 0 and bool(self._active) and not self._engine_alive()
            for request_id, (sender, task) in list(self._active.items()):
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


def _parameters(request) -> dict:
    """Request parameters (HTTP /generate "parameters") travel on to the engine model."""
    raw = request.parameters() if hasattr(request, "parameters") else "{}"
    try:
        params = json.loads(raw) if isinstance(raw, str) else dict(raw or {})
    except json.JSONDecodeError:
        return {}
    return {k: v for k, v in params.items() if not k.startswith(("triton_", "tritongen_"))}
