"""Every bad input gets the right status and OpenAI's error shape; nothing is a 500."""
import httpx
import pytest

from oai_helpers import MODEL

CHAT = [{"role": "user", "content": "hi"}]


def c(**kw):
    return ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2, **kw})


def ch(**kw):
    return ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 2, **kw})


CASES = [
    # (request, status, param)
    (c(temperature=-1), 400, "temperature"),
    (c(temperature="hot"), 400, "temperature"),
    (c(top_p=0), 400, "top_p"),
    (c(top_k=-5), 400, "top_k"),
    (c(min_p=2), 400, "min_p"),
    (c(presence_penalty=5), 400, "presence_penalty"),
    (c(frequency_penalty=-3), 400, "frequency_penalty"),
    (c(repetition_penalty=0), 400, "repetition_penalty"),
    (c(n=2), 400, "n"),
    (c(best_of=2), 400, "best_of"),
    (c(logprobs=50), 400, "logprobs"),
    (c(max_tokens=0), 400, "max_tokens"),
    (c(max_tokens=-1), 400, "max_tokens"),
    (c(max_tokens=10 ** 6), 400, "max_tokens"),
    (c(min_tokens=5), 400, "min_tokens"),
    (c(seed=2 ** 70), 400, "seed"),
    (c(seed="x"), 400, "seed"),
    (c(stop=[""]), 400, "stop"),
    (c(stop=5), 400, "stop"),
    (c(logit_bias={"5": 1}), 400, "logit_bias"),
    (c(prompt=""), 400, "prompt"),
    (c(prompt=[]), 400, "prompt"),
    (c(prompt=[1, 10 ** 7]), 400, "prompt"),
    (c(prompt=[1] * 3000), 400, "prompt"),
    (c(prompt={"a": 1}), 400, "prompt"),
    (c(prompt=["a", "b"], stream=True), 400, "prompt"),
    (c(temperature=-1, stream=True), 400, "temperature"),
    (("/v1/completions", {"model": MODEL}), 400, "prompt"),
    (c(model="gpt-4"), 404, "model"),
    (ch(messages=[]), 400, "messages"),
    (ch(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400, "messages"),
    (ch(messages=[{"content": "no role"}]), 400, "messages"),
    (ch(top_logprobs=2), 400, "top_logprobs"),
    (ch(logprobs=True, top_logprobs=30), 400, "top_logprobs"),
    (ch(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
    (ch(response_format={"type": "json_object"}), 400, "response_format"),
    (ch(max_completion_tokens=10 ** 6, stream=True), 400, "max_tokens"),
    (ch(model="nope"), 404, "model"),
    # strict types, as the OpenAI API's (issue 21 item 10): no "4" or true for an integer
    (c(max_tokens="4"), 400, "max_tokens"),
    (c(max_tokens=True), 400, "max_tokens"),
    (c(max_tokens=4.0), 400, "max_tokens"),
    (c(temperature="0.5"), 400, "temperature"),
    (c(temperature=True), 400, "temperature"),
    (c(prompt=[True, False]), 400, "prompt"),
    (c(prompt=[[1, True]]), 400, "prompt"),
    (c(stream="true"), 400, "stream"),
    (c(echo=1), 400, "echo"),
    (c(n=0), 400, "n"),
    (c(best_of=-1), 400, "best_of"),
    (ch(messages=[{"role": "bogus", "content": "x"}]), 400, "messages"),
    (ch(messages=[{"role": "", "content": "x"}]), 400, "messages"),
    (ch(messages=[{"role": "user", "content": 5}]), 400, "messages"),
    (ch(logprobs=1), 400, "logprobs"),
    (ch(stream_options={"include_usage": "yes"}, stream=True), 400, "stream_options"),
]


def check_shape(r, status):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


@pytest.mark.parametrize("request_,status,param", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_bad_parameters(server, request_, status, param):
    path, body = request_
    err = check_shape(httpx.post(server.url + path, json=body), status)
    assert err["param"] == param, err


def test_type_errors_say_what_was_expected(server):
    err = check_shape(httpx.post(server.url + "/v1/completions", json=c(n=0)[1]), 400)
    assert "greater than or equal to 1" in err["message"] and "n > 1" not in err["message"], err
    err = check_shape(httpx.post(server.url + "/v1/completions", json=c(max_tokens="4")[1]), 400)
    assert "valid integer" in err["message"], err
    err = check_shape(httpx.post(server.url + "/v1/chat/completions",
                                 json=ch(messages=[{"role": "bogus", "content": "x"}])[1]), 400)
    assert "role" in err["message"] and "'user'" in err["message"], err


def test_ints_are_valid_floats(client):
    r = client.completions.create(model=MODEL, prompt="x", max_tokens=2, temperature=1, top_p=1,
                                  presence_penalty=0, extra_body={"min_p": 0, "repetition_penalty": 1})
    assert r.usage.completion_tokens >= 1


@pytest.mark.parametrize("raw", [b"{bad json", b"[]", b"null", b"\xff\xfe", b'{"prompt": "x", "temperature": NaN}', b""])
def test_malformed_bodies_are_400(server, raw):
    for path in ("/v1/completions", "/v1/chat/completions"):
        check_shape(httpx.post(server.url + path, content=raw, headers={"Content-Type": "application/json"}), 400)


def test_body_size_limit_is_413(server):
    big = b'{"prompt": "' + b"x" * (2 << 20) + b'"}'
    check_shape(httpx.post(server.url + "/v1/completions", content=big), 413)

    def chunks():  # no Content-Length: the limit still holds while streaming the body in
        for _ in range(40):
            yield b"x" * 65536
    check_shape(httpx.post(server.url + "/v1/completions", content=chunks()), 413)


def test_unknown_routes_and_methods(server):
    check_shape(httpx.get(server.url + "/v1/nothing"), 404)
    check_shape(httpx.get(server.url + "/v1/completions"), 405)


def test_server_still_serves_after_all_that(client):
    assert client.completions.create(model=MODEL, prompt="ok", max_tokens=2).usage.completion_tokens >= 1
