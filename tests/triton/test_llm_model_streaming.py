"""The llm model's streaming loop against a fake pb_utils and a scripted engine: stream_interval
groups tokens per response, the final response carries what was held, and sends never run on the
event loop's thread."""
import asyncio
import concurrent.futures
import json
import threading

import numpy as np
import pytest

import fake_pb_utils as pb
from fake_engine import OpenOverGenerate
from tritongen.triton import codec, llm_model
from tritongen.types import RequestOutput

WORDS = ["a", "b", "c", "d", "e", "f", "g"]


class NullSink:
    def observe(self, name, value):
        pass

    def increment(self, name, value, labels=None):
        pass

    def set_gauge(self, name, value):
        pass


class ScriptedEngine(OpenOverGenerate):
    """One output per step; a step lasts far longer than a send (a send in flight would merge the
    steps arriving meanwhile into its next response)."""

    async def generate(self, prompt, params, request_id):
        for i, word in enumerate(WORDS):
            await asyncio.sleep(0.02)
            yield RequestOutput(request_id=request_id, prompt_token_ids=[1], text="".join(WORDS[:i + 1]),
                                token_ids=list(range(i + 1)), delta_text=word, delta_token_ids=[i],
                                finish_reason="length" if i == len(WORDS) - 1 else None)


class Sender:
    def __init__(self):
        self.sent, self.threads = [], set()

    def send(self, response=None, flags=0):
        self.threads.add(threading.current_thread().name)
        self.sent.append((response, flags))


def run(interval: int):
    model = llm_model.TritonPythonModel.__new__(llm_model.TritonPythonModel)
    model.pb, model.engine, model.metrics, model.batch_dim = pb, ScriptedEngine(), NullSink(), False
    model.stream_interval, model._active, model.block_size = interval, {}, 16
    model._senders = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="tritongen-send")
    request = pb.InferenceRequest({"text_input": np.array([b"x"], dtype=np.object_), "stream": np.array([True]),
                                   "sampling_parameters": np.array([json.dumps({"max_tokens": 7}).encode()],
                                                                   dtype=np.object_)})
    sender = Sender()
    asyncio.run(model._generate("r-0", codec.parse_request(request, pb), sender))
    model._senders.shutdown()
    texts = [r.get("text_output")[0].decode() for r, _ in sender.sent]
    finals = [flags == pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL for _, flags in sender.sent]
    return texts, finals, sender.threads


@pytest.mark.parametrize("interval,want", [(1, list("abcdefg")), (3, ["abc", "def", "g"]), (5, ["abcde", "fg"]),
                                           (10, ["abcdefg"])])
def test_stream_interval_groups_tokens_and_the_final_carries_the_rest(interval, want):
    texts, finals, threads = run(interval)
    assert texts == want
    assert finals == [False] * (len(want) - 1) + [True]
    assert all(t.startswith("tritongen-send") for t in threads)  # never the event loop's thread


def test_stream_interval_parameter(monkeypatch):
    assert llm_model.stream_interval({}) == 1
    monkeypatch.setenv("TRITONGEN_STREAM_INTERVAL", "2")  # no environment fallback: the parameter decides
    assert llm_model.stream_interval({}) == 1
    assert llm_model.stream_interval({"stream_interval": {"string_value": "4"}}) == 4
    with pytest.raises(ValueError, match="stream_interval must be a positive integer, got '0'"):
        llm_model.stream_interval({"stream_interval": {"string_value": "0"}})


def test_default_sender_threads_follow_the_batch():
    assert [llm_model.default_sender_threads(n) for n in (1, 64, 128, 256, 512, 2048)] == [8, 8, 16, 32, 32, 32]


def test_sender_threads_parameter():
    default = llm_model.default_sender_threads(256)
    assert llm_model.positive_parameter({}, "sender_threads", default) == default
    assert llm_model.positive_parameter({"sender_threads": {"string_value": "3"}}, "sender_threads", default) == 3
    with pytest.raises(ValueError, match="sender_threads must be a positive integer, got 'x'"):
        llm_model.positive_parameter({"sender_threads": {"string_value": "x"}}, "sender_threads", default)


def test_repo_writes_sender_threads(tmp_path):
    from tritongen.triton.repo import write_repository

    write_repository(tmp_path, {}, sender_threads=3)
    assert 'key: "sender_threads" value: { string_value: "3" }' in (tmp_path / "llm" / "config.pbtxt").read_text()
    with pytest.raises(ValueError, match="sender_threads must be an integer >= 1"):
        write_repository(tmp_path / "x", {}, sender_threads=0)


class BurstEngine(OpenOverGenerate):
    """All of WORDS in one burst: the steps arrive while the first response's send is in flight."""

    async def generate(self, prompt, params, request_id):
        for i, word in enumerate(WORDS):
            yield RequestOutput(request_id=request_id, prompt_token_ids=[1], text="".join(WORDS[:i + 1]),
                                token_ids=list(range(i + 1)), delta_text=word, delta_token_ids=[i],
                                finish_reason="length" if i == len(WORDS) - 1 else None)


class SlowSender(Sender):
    def __init__(self):
        super().__init__()
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Lock()

    def send(self, response=None, flags=0):
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        threading.Event().wait(0.05)
        super().send(response, flags)
        with self.lock:
            self.in_flight -= 1


def test_steps_arriving_during_a_send_are_merged_into_the_next_response_and_the_final_follows_it():
    model = llm_model.TritonPythonModel.__new__(llm_model.TritonPythonModel)
    model.pb, model.engine, model.metrics, model.batch_dim = pb, BurstEngine(), NullSink(), False
    model.stream_interval, model._active, model.block_size = 1, {}, 16
    model._senders = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="tritongen-send")
    request = pb.InferenceRequest({"text_input": np.array([b"x"], dtype=np.object_), "stream": np.array([True])})
    sender = SlowSender()
    asyncio.run(model._generate("r-0", codec.parse_request(request, pb), sender))
    model._senders.shutdown()
    texts = [r.get("text_output")[0].decode() for r, _ in sender.sent]
    assert "".join(texts) == "abcdefg" and len(texts) < len(WORDS)  # merged, nothing lost
    assert [flags for _, flags in sender.sent][-1] == pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    assert sender.most_in_flight == 1  # one send at a time per request
