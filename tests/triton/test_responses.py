"""The llm model's send side (triton/responses.py) against the fake pb_utils: the tensor cache
hands back a tensor only once it was sent, never caches what does not repeat, and stays bounded;
metric updates are deferred, then flushed with counters summed; send_on reports the send's outcome."""
import asyncio
import threading

import numpy as np
import pytest

import fake_pb_utils as pb
from tritongen.triton import codec
from tritongen.triton.responses import MetricOps, SendThreads, TensorCache, send_on
from tritongen.types import RequestOutput


def streamed(text: str, ids: list[int]) -> RequestOutput:
    return RequestOutput(request_id="r", prompt_token_ids=[1], text=text, token_ids=ids, delta_text=text,
                         delta_token_ids=ids)


def parsed(**outputs) -> codec.ParsedRequest:
    return codec.ParsedRequest(prompt="p", params=codec.SamplingParams(), stream=True,
                               outputs=codec.OutputOptions(**outputs))


def test_a_tensor_is_reused_only_after_it_was_sent():
    cache = TensorCache(pb)
    req = parsed(num_output_tokens=True)
    first = codec.make_response(streamed(" the", [5]), req, cache)
    fresh = cache.take_fresh()
    again = codec.make_response(streamed(" the", [6]), req, cache)  # not admitted yet: built anew
    assert again.output_tensors()[0] is not first.output_tensors()[0]
    cache.take_fresh()
    cache.admit(fresh)
    third = codec.make_response(streamed(" the", [7]), req, cache)
    assert [t.name() for t in third.output_tensors()] == ["text_output", "num_output_tokens"]
    assert third.output_tensors()[0] is first.output_tensors()[0]
    assert third.output_tensors()[1] is first.output_tensors()[1]  # one token, as before
    assert third.get("text_output").tolist() == [b" the"] and third.get("num_output_tokens").tolist() == [1]
    assert cache.take_fresh() == []


@pytest.mark.parametrize("batch_dim", [False, True])
def test_a_text_tensor_is_the_one_make_response_builds(batch_dim):
    cache = TensorCache(pb)
    sent = codec.make_response(streamed(" fox", [5]), parsed(), cache, batch_dim=batch_dim)
    assert cache.text("text_output", " fox", batch_dim) is not sent.output_tensors()[0]  # not sent yet
    cache.admit(cache.take_fresh())
    tensor = cache.text("text_output", " fox", batch_dim)
    assert tensor is sent.output_tensors()[0] and cache.take_fresh() == []
    long_text = cache.text("text_output", "y" * 100, batch_dim)
    assert long_text.as_numpy().tolist() == ([[b"y" * 100]] if batch_dim else [b"y" * 100])
    assert cache.take_fresh() == []


def test_values_that_do_not_repeat_or_are_long_are_never_cached():
    cache = TensorCache(pb, max_entries=2, max_value_bytes=8)
    long_text = codec.make_response(streamed("x" * 9, [1]), parsed(), cache)
    timing = cache.Tensor("arrival_time_ns", np.array([123], dtype=np.int64))
    assert cache.take_fresh() == [] and long_text.get("text_output").tolist() == [b"x" * 9]
    assert timing.as_numpy().tolist() == [123]
    for word in ("a", "b", "c"):
        codec.make_response(streamed(word, [1]), parsed(), cache)
        cache.admit(cache.take_fresh())
    assert len(cache._cache) == 2  # bounded
    assert cache.InferenceResponse is pb.InferenceResponse  # everything else is pb_utils itself


def test_metric_updates_are_deferred_then_flushed_with_counters_summed():
    seen = []

    class Sink:
        def observe(self, name, value):
            seen.append(("observe", name, value))

        def increment(self, name, value, labels=None):
            seen.append(("increment", name, value, labels))

        def set_gauge(self, name, value):
            seen.append(("gauge", name, value))

    sink = Sink()
    first, second = MetricOps(sink), MetricOps(sink)
    first.observe("ttft", 0.1)
    first.defer()  # a streamed output: handed over, no update yet
    assert seen == []
    first.increment("done", 1, {"finish_reason": "stop"})
    second.increment("done", 2, {"finish_reason": "stop"})
    second.increment("done", 1, {"finish_reason": "length"})
    second.defer()
    first.apply()  # its FINAL: everything pending goes out, one update per counter series
    assert seen == [("observe", "ttft", 0.1), ("increment", "done", 3, {"finish_reason": "stop"}),
                    ("increment", "done", 1, {"finish_reason": "length"})]
    first.apply()
    assert len(seen) == 3  # applied once


def test_send_on_reports_the_outcome_from_the_sender_thread():
    pool = SendThreads(2, "test-send")
    threads = []

    def ok():
        threads.append(threading.current_thread().name)

    def fails():
        raise RuntimeError("client gone")

    async def go():
        await send_on(pool, ok)
        with pytest.raises(RuntimeError, match="client gone"):
            await send_on(pool, fails)
    try:
        asyncio.run(go())
    finally:
        pool.shutdown()
    assert threads and threads[0].startswith("test-send")


def test_finished_bls_requests_are_let_go_only_after_the_hold(monkeypatch):
    import weakref

    from tritongen.triton import bls_model

    class Obj:
        pass

    clock = [100.0]
    monkeypatch.setattr(bls_model.time, "monotonic", lambda: clock[0])
    held = bls_model._Held(5.0)
    first = Obj()
    gone = weakref.ref(first)
    held.keep(first, Obj())
    del first
    clock[0] += 4.9
    held.keep(Obj())
    assert gone() is not None  # still within the hold
    clock[0] += 0.2
    held.keep(Obj())
    assert gone() is None  # released by a later keep, past the hold


def test_bls_watcher_asks_each_request_once_per_poll_interval_and_cancels_the_cancelled(monkeypatch):
    import itertools

    from tritongen.triton import bls_model, control

    ticks_per_poll = round(control.CANCEL_POLL_S / bls_model._WATCH_INTERVAL_S)
    monkeypatch.setattr(bls_model, "_WATCH_INTERVAL_S", 0.001)  # faster ticks, the same ratio
    monkeypatch.setattr(control, "CANCEL_POLL_S", 0.001 * ticks_per_poll)
    yielded: list[int] = []

    class CountingItertools:
        @staticmethod
        def count():
            for tick in itertools.count():
                yielded.append(tick)
                yield tick

    monkeypatch.setattr(bls_model, "itertools", CountingItertools)

    class Sender:
        def __init__(self, cancelled: bool) -> None:
            self.asked, self.cancelled = 0, cancelled

        def is_cancelled(self) -> bool:
            self.asked += 1
            return self.cancelled

    async def go():
        model = object.__new__(bls_model.TritonPythonModel)
        model._active, model._unavailable = {}, set()
        model._engine_alive = lambda: True
        never = asyncio.get_running_loop().create_future()
        tasks = {seq: asyncio.ensure_future(asyncio.shield(never)) for seq in range(10)}
        senders = {seq: Sender(cancelled=seq == 3) for seq in range(10)}
        for seq in range(10):
            model._active[f"r{seq}"] = (senders[seq], tasks[seq], seq)
        watcher = asyncio.ensure_future(model._watch())
        while len(yielded) < 3 * ticks_per_poll + 2:
            await asyncio.sleep(0.001)
        watcher.cancel()  # it waits after yielding its last tick: the ticks before it were polled
        await asyncio.sleep(0)
        return model, tasks, senders

    model, tasks, senders = asyncio.run(go())
    assert ticks_per_poll == 4
    polled = yielded[:-1]
    assert senders[3].asked == 1 and tasks[3].cancelled() and "r3" not in model._active
    for seq, sender in senders.items():
        if seq != 3:  # asked on its own tick of every round, never on the others
            assert sender.asked == sum(1 for t in polled if t % ticks_per_poll == seq % ticks_per_poll), seq
            assert not tasks[seq].cancelled()
