"""The llm model's request path against a fake pb_utils and a scripted engine: every request ends
with exactly one FINAL whatever it holds, the control input needs the engine model's token, the
queue bound and a down engine answer UNAVAILABLE, and cancellations are counted."""
import asyncio
import concurrent.futures
import itertools
import json
import os

import numpy as np
import pytest

import fake_pb_utils as pb
from fake_engine import OpenOverGenerate
from tritongen.entrypoints.async_engine import EngineDeadError
from tritongen.triton import control, llm_model, values
from tritongen.types import RequestOutput


class Sink:
    def __init__(self):
        self.counts = {}

    def observe(self, name, value):
        pass

    def increment(self, name, value, labels=None):
        key = (name, tuple(sorted((labels or {}).items())))
        self.counts[key] = self.counts.get(key, 0) + value

    def set_gauge(self, name, value):
        pass


class Engine(OpenOverGenerate):
    """Streams `tokens` outputs, one every `delay` seconds; records aborts."""

    def __init__(self, tokens=3, delay=0.0, running=True, error=None):
        self.tokens, self.delay, self.is_running, self.error = tokens, delay, running, error
        self.aborted = []

    async def generate(self, prompt, params, request_id):
        if self.error is not None:
            raise self.error
        for i in range(self.tokens):
            await asyncio.sleep(self.delay)
            yield RequestOutput(request_id=request_id, prompt_token_ids=[1], text="x" * (i + 1),
                                token_ids=list(range(i + 1)), delta_text="x", delta_token_ids=[i],
                                finish_reason="length" if i == self.tokens - 1 else None)

    async def abort(self, request_id):
        self.aborted.append(request_id)

    def stats(self):
        return {"num_running": 0, "num_waiting": 0, "kv_blocks_total": 1, "kv_blocks_free": 1,
                "prefix_cache_hit_rate": 0.0}


class Sender:
    def __init__(self):
        self.sent = []

    def send(self, response=None, flags=0):
        self.sent.append((response, flags))

    def is_cancelled(self):
        return False

    def finals(self):
        return [r for r, flags in self.sent if flags == pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL]


class Request(pb.InferenceRequest):
    def __init__(self, inputs, parameters=None, request_id=""):
        super().__init__(inputs, parameters, request_id)
        self.sender = Sender()

    def get_response_sender(self):
        return self.sender


def model(engine, max_queue=0, max_num_seqs=4, token="t" * 64):
    m = llm_model.TritonPythonModel.__new__(llm_model.TritonPythonModel)
    m.pb, m.engine, m.metrics, m.batch_dim, m.stream_interval = pb, engine, Sink(), False, 1
    m.max_queue, m.max_num_seqs, m._closing, m._control_token = max_queue, max_num_seqs, False, token
    m._active, m._ids, m._counted, m.block_size = {}, itertools.count(), {}, 16
    m._senders = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="tritongen-send")
    return m


def serve(m, *requests):
    async def go():
        await asyncio.gather(*(m._serve(r) for r in requests))
    asyncio.run(go())
    return [r.sender.finals() for r in requests]


def text_request(**extra):
    return Request({"text_input": pb.text("hi"), **extra})


def only_final(finals):
    assert len(finals) == 1, f"{len(finals)} FINAL responses"
    return finals[0]


@pytest.mark.parametrize("inputs,needle", [
    ({"sampling_parameters": pb.text("[" * 5000 + "]" * 5000)}, "'sampling_parameters' nests deeper"),
    ({"sampling_parameters": pb.text('{"max_tokens": ' + "1" * 5000 + "}")}, "'sampling_parameters'"),
    ({"sampling_parameters": pb.text('{"seed": 18446744073709551616}')}, "seed"),
    ({"sampling_parameters": pb.text('{"stop": "' + "s" * 70000 + '"}')}, "'sampling_parameters' is 70012 characters"),
    ({"seed": np.array([2**64 - 1], dtype=np.uint64), "temperature": pb.text("hot")}, "'temperature'"),
])
def test_bad_json_and_values_end_at_once_with_invalid_arg(inputs, needle):
    engine = Engine()
    finals = serve(model(engine), text_request(**inputs))[0]
    error = only_final(finals).error()
    assert error.code() == pb.TritonError.INVALID_ARG and needle in error.message(), error.message()


def test_control_input_needs_the_token():
    victim = text_request()
    m = model(Engine(tokens=50, delay=0.01))

    async def go():
        task = asyncio.ensure_future(m._serve(victim))
        await asyncio.sleep(0.05)
        forged = Request({"abort_request_id": pb.text(next(iter(m._active)))}, {"tritongen_control_token": "guess"})
        await m._serve(forged)
        await task
        return forged
    forged = asyncio.run(go())
    error = only_final(forged.sender.finals()).error()
    assert error.code() == pb.TritonError.INVALID_ARG and "abort_request_id" in error.message()
    assert only_final(victim.sender.finals()).error() is None  # the victim ran to its end
    assert m.engine.aborted == []


def test_control_input_with_the_token_aborts_and_counts():
    victim = Request({"text_input": pb.text("hi")}, request_id="llm_bls-1-0")
    m = model(Engine(tokens=500, delay=0.01))

    async def go():
        task = asyncio.ensure_future(m._serve(victim))
        await asyncio.sleep(0.05)
        await m._serve(Request({"abort_request_id": pb.text("llm_bls-1-0")},
                               {control.TOKEN_PARAMETER: m._control_token}))
        await task
    asyncio.run(go())
    assert only_final(victim.sender.finals()).error().code() == pb.TritonError.CANCELLED
    assert len(m.engine.aborted) == 1
    assert m.metrics.counts[("tritongen_request_success_total", (("finish_reason", "abort"),))] == 1


def test_queue_bound_refuses_at_once_with_unavailable():
    m = model(Engine(tokens=20, delay=0.01), max_queue=2, max_num_seqs=2)
    results = serve(m, *[text_request() for _ in range(8)])
    codes = sorted((only_final(f).error().code() if only_final(f).error() else -1) for f in results)
    assert codes.count(-1) == 4 and codes.count(pb.TritonError.UNAVAILABLE) == 4, codes
    assert m.metrics.counts[("tritongen_request_rejected_total", ())] == 4


def test_engine_down_is_unavailable_never_invalid_arg():
    finals = serve(model(Engine(running=False)), text_request())[0]
    assert only_final(finals).error().code() == pb.TritonError.UNAVAILABLE
    finals = serve(model(Engine(error=EngineDeadError("engine stopped"))), text_request())[0]
    assert only_final(finals).error().code() == pb.TritonError.UNAVAILABLE


def test_an_unexpected_failure_still_ends_the_request():
    m = model(Engine())
    m._admit = lambda request: 1 / 0
    finals = serve(m, text_request())[0]
    assert only_final(finals).error().code() == pb.TritonError.INTERNAL


def test_control_token_file_is_private_and_names_this_process(tmp_path, monkeypatch):
    monkeypatch.setattr(control.tempfile, "gettempdir", lambda: str(tmp_path))
    token = control.publish_token("llm-test")
    path = control.token_path("llm-test")
    assert control.read_token("llm-test") == token and len(token) == 64
    assert control.engine_pid("llm-test") == os.getpid() and control.process_alive(os.getpid())
    assert path.stat().st_mode & 0o077 == 0 and path.parent.stat().st_mode & 0o077 == 0
    assert control.is_valid(token, token) and not control.is_valid("x" * 64, token) and not control.is_valid(None, token)
    control.remove_token("llm-test")
    assert control.read_token("llm-test") is None


def test_json_depth_skips_brackets_in_strings():
    assert values.json_depth(json.dumps({"stop": ["[[[[[[[[[[[[", "{{{{{{"]})) == 2
    assert values.json_depth('{"a": "\\"[[[["}') == 1


def test_drain_file_ends_requests_in_flight_unavailable_and_stops_metrics(tmp_path):
    drain = tmp_path / "draining"
    m = model(Engine(tokens=1000, delay=0.01))
    m._drain_file = str(drain)
    sink = m.metrics
    m.metrics = llm_model._UnlessClosing(sink, m)
    requests = [text_request() for _ in range(3)]

    async def go():
        watcher = asyncio.ensure_future(m._watch())
        tasks = [asyncio.ensure_future(m._serve(r)) for r in requests]
        await asyncio.sleep(0.2)
        before = dict(sink.counts)
        drain.touch()
        await asyncio.wait_for(asyncio.gather(*tasks), 2.0)  # at once, not after 1000 tokens
        late = text_request()
        await m._serve(late)
        await asyncio.sleep(0.3)
        watcher.cancel()
        return late, before
    late, before = asyncio.run(go())
    for r in requests + [late]:
        error = only_final(r.sender.finals()).error()
        assert error.code() == pb.TritonError.UNAVAILABLE and "shutting down" in error.message()
    assert sink.counts == before  # no metric round trip once closing
