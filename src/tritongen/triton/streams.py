"""One request of the `llm` model between the engine's steps and its sender: the outputs arrive in
the engine step's one callback on the loop (AsyncLLM.open), sends complete in batches
(responses.LoopCalls); no asyncio task wakes up per step or per send. The request's task waits
once, for `done`.

One streamed send is in flight per request at a time; the steps arriving meanwhile are merged into
its next response (as are those held back by stream_interval), so a slow send costs one response,
not one per token.
"""
from __future__ import annotations

import asyncio
import time
import weakref
from typing import Callable, Optional

from tritongen.triton import codec
from tritongen.triton.responses import LoopCalls, MetricOps
from tritongen.types import RequestOutput, merge_outputs

_LOOP_CALLS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopCalls]" = weakref.WeakKeyDictionary()


def loop_calls(loop: asyncio.AbstractEventLoop) -> LoopCalls:
    """The loop's one LoopCalls (created on the loop's thread, where every request starts)."""
    calls = _LOOP_CALLS.get(loop)
    if calls is None:
        calls = _LOOP_CALLS[loop] = LoopCalls(loop)
    return calls


class ResponseStream:
    """`on_item` (on the loop) takes each engine output; `done` completes with the finished output
    (whatever was held merged into it) or the exception that ended the request: the engine's
    (EngineDeadError, ValueError), `error_type` for an output carrying an error, a streamed send's."""

    def __init__(self, model, parsed: codec.ParsedRequest, sender, timer, perf, ops: MetricOps,
                 decode: Optional[Callable[[int], str]], error_type: type) -> None:
        self._model, self._parsed, self._sender = model, parsed, sender
        self._timer, self._perf, self._ops, self._decode, self._error_type = timer, perf, ops, decode, error_type
        self._wants_tokens = parsed.outputs.output_ids or parsed.outputs.num_output_tokens
        self._wants_perf = parsed.outputs.perf_metrics
        self._text_only = parsed.outputs == codec.OutputOptions()
        """No optional output asked for: a streamed response is its text_output alone."""
        loop = asyncio.get_running_loop()
        self._calls = loop_calls(loop)
        self.done: asyncio.Future = loop.create_future()
        self._held: Optional[RequestOutput] = None
        """Streamed deltas not sent yet: fewer than stream_interval tokens, or a send in flight."""
        self._sending = False
        self._send_error: Optional[BaseException] = None
        self._idle: Optional[asyncio.Future] = None
        """Completed by the send in flight, once the request waits for it (settled())."""

    def on_item(self, item: object) -> None:
        if self.done.done():
            return  # ended (or its task went away): later outputs are dropped
        try:
            if isinstance(item, BaseException):
                raise item
            if item.error:  # counted as an error by the caller, not as a finished request
                raise self._error_type(f"engine error: {item.error}")
            self._timer.on_output(item, self._ops)
            self._ops.defer()  # applied by the watcher's next flush, or before the FINAL
            if self._wants_perf:
                self._perf.update(item, time.time_ns(), self._model.block_size)
            if self._parsed.stream and self._held is not None:
                item, self._held = merge_outputs(self._held, item), None
            if item.finished:
                self.done.set_result(item)
            elif not self._parsed.stream:
                return
            elif self._sending:
                self._held = item
            else:
                self._stream(item)
        except Exception as exc:  # a bug of ours ends only this request (with the cause)
            self.done.set_exception(exc)

    async def settled(self, raise_error: bool = True) -> None:
        """Wait for the streamed send in flight, if any (the FINAL must follow it); raise_error:
        raise the failure of a streamed send."""
        if self._sending:
            if self._idle is None:
                self._idle = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._idle)
        if raise_error and self._send_error is not None:
            raise self._send_error

    def _stream(self, out: RequestOutput) -> None:
        model = self._model
        if len(out.delta_token_ids) < model.stream_interval:
            self._held = out
        # A step whose text is held back (split UTF-8 character, possible stop string) still
        # carries tokens: clients counting tokens per response must see it.
        elif out.delta_text or (self._wants_tokens and out.delta_token_ids):
            tensors = model._tensors
            if self._text_only:  # make_response's tensors, without building an array per response
                response = tensors.InferenceResponse(
                    output_tensors=[tensors.text("text_output", out.delta_text, model.batch_dim)])
            else:
                response = codec.make_response(out, self._parsed, tensors, batch_dim=model.batch_dim,
                                               decode=self._decode, perf=self._perf)
            fresh = tensors.take_fresh()
            self._sending = True
            model._senders.submit(self._send, response, fresh)

    def _send(self, response, fresh: list) -> None:
        """Sender thread."""
        try:
            self._sender.send(response)
            if fresh:
                self._model._tensors.admit(fresh)
            error = None
        except BaseException as exc:
            error = exc
        self._calls.post(self._sent, error)

    def _sent(self, error: Optional[BaseException]) -> None:
        self._sending = False
        if self._idle is not None and not self._idle.done():
            self._idle.set_result(None)
        if error is not None:
            self._send_error = self._send_error or error
            if not self.done.done():
                self.done.set_exception(error)
        elif self._held is not None and not self.done.done():
            held, self._held = self._held, None
            self._stream(held)
