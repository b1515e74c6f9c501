"""SSE parsing of the HTTP targets: events come out the same however the network cuts the body."""
import asyncio
import json

import httpx
import pytest

from tritongen.bench.datasets import BenchRequest
from tritongen.bench.targets import OpenAITarget, SSEParser, _sse_events

# Texts JSON may carry unescaped: multi-byte UTF-8 (2, 3 and 4 bytes) and the characters
# str.splitlines() takes for line ends (U+2028, U+2029, U+0085), next to an escaped newline.
TEXTS = ["é", "日本語", "🙂", "a\u2028b", "c\u2029d", "e\x85f", "g\nh"]
PAYLOADS = [{"choices": [{"index": 0, "text": t}]} for t in TEXTS] + [{"choices": [], "usage": {"completion_tokens": 7}}]


def _body(newline: str = "\n") -> bytes:
    events = [f"data: {json.dumps(p, ensure_ascii=False)}" for p in PAYLOADS]
    # A comment, a field without a space after the colon, and one event split over two data lines.
    events[1] = ": keep-alive" + newline + events[1].replace("data: ", "data:")
    events[2] = events[2].replace(', "text"', "," + newline + 'data: "text"')
    return (newline * 2).join(events + ["data: [DONE]"]).encode() + (newline * 2).encode()


def _parse(pieces) -> list[str]:
    parser = SSEParser()
    events = [e for piece in pieces for e in parser.feed(piece)]
    return events + parser.close()


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_events_are_the_same_at_every_split(newline):
    body = _body(newline)
    whole = _parse([body])
    assert [json.loads(e) for e in whole[:-1]] == PAYLOADS and whole[-1] == "[DONE]"
    for i in range(len(body) + 1):  # inside multi-byte characters, JSON strings, CRLFs, "data:"
        assert _parse([body[:i], body[i:]]) == whole, f"split at byte {i}: {body[max(0, i - 8):i + 8]!r}"
    assert _parse([body[i:i + 1] for i in range(len(body))]) == whole


def test_splits_inside_a_character_and_inside_json_are_covered():
    body = _body()
    emoji = body.index("🙂".encode())
    assert _parse([body[:emoji + 2], body[emoji + 2:]]) == _parse([body])  # 2 bytes into 4
    sep = body.index("\u2028".encode())
    assert _parse([body[:sep + 1], body[sep + 1:]]) == _parse([body])


def test_a_last_event_without_its_blank_line_still_counts():
    assert _parse([b'data: {"a": 1}']) == ['{"a": 1}']
    assert _parse([b'data: {"a": 1}\r']) == ['{"a": 1}']
    assert _parse([b": only a comment\n"]) == []


class _Pieces(httpx.AsyncByteStream):
    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    async def __aiter__(self):
        for piece in self.pieces:
            yield piece


def _respond(pieces: list[bytes]):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_Pieces(pieces))

    return handler


def test_sse_events_reads_the_network_pieces():
    body = _body()

    async def run(pieces):
        async with httpx.AsyncClient(transport=httpx.MockTransport(_respond(pieces))) as client:
            async with client.stream("GET", "http://test/") as r:
                return [e async for e in _sse_events(r)]

    assert asyncio.run(run([body])) == PAYLOADS
    assert asyncio.run(run([body[i:i + 3] for i in range(0, len(body), 3)])) == PAYLOADS


def test_openai_target_keeps_texts_with_unicode_line_separators():
    """The 7B run's 'Unterminated string': the server's JSON carried U+2028 unescaped."""
    body = _body()
    target = OpenAITarget("http://test", "m", None, 1, 10.0)

    async def run():
        await target.start()
        await target.client.aclose()
        target.client = httpx.AsyncClient(transport=httpx.MockTransport(_respond([body[:150], body[150:]])))
        try:
            return [c async for c in target.stream(BenchRequest("p", 1, 7))]
        finally:
            await target.close()

    chunks = asyncio.run(run())
    assert "".join(c.text for c in chunks) == "".join(TEXTS)
    assert chunks[-1].total_tokens == 7
