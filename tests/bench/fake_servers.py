"""Minimal in-test servers speaking just enough of the OpenAI completions API (stdlib only).

The fake streams `max_tokens` one-word chunks `delay` seconds apart as SSE, then a usage chunk and
[DONE]; prompts containing "FAIL" get HTTP 500. Loglikelihood requests (echo + logprobs) get
deterministic logprobs: -1 per token, and the top token is the chosen one when its id is even.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # close after each response: the body ends at EOF
    delay = 0.01

    def log_message(self, *args) -> None:
        pass

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(body)
        prompt = body.get("prompt")
        if isinstance(prompt, str) and "FAIL" in prompt:
            return self._json(500, {"error": {"message": "asked to fail", "type": "server_error"}})
        if body.get("echo"):
            return self._json(200, _echo_response(prompt))
        n = int(body.get("max_tokens") or 16)
        if not body.get("stream"):
            time.sleep(self.delay * n)
            return self._json(200, {"choices": [{"index": 0, "text": " w" * n, "finish_reason": "length"}],
                                    "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(n):
            time.sleep(self.delay)
            self._event({"choices": [{"index": 0, "text": f" w{i}", "finish_reason": None}]})
        self._event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}})
        self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, payload: dict) -> None:
        self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
        self.wfile.flush()


def _echo_response(prompt: list[int]) -> dict:
    lps = [None] + [-1.0] * (len(prompt) - 1)
    tops = [None] + [{f"t{t}": -1.0} if t % 2 == 0 else {f"t{t}": -1.0, "other": -0.5} for t in prompt[1:]]
    return {"choices": [{"index": 0, "text": "", "finish_reason": "length",
                         "logprobs": {"tokens": [f"t{t}" for t in prompt], "token_logprobs": lps,
                                      "top_logprobs": tops, "text_offset": list(range(len(prompt)))}}]}


class FakeOpenAIServer:
    """Context manager: a threaded fake on 127.0.0.1; `url`, and `requests` (bodies received)."""

    def __init__(self, delay: float = 0.01) -> None:
        handler = type("Handler", (_Handler,), {"delay": delay})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.requests = []
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def requests(self) -> list[dict]:
        return self.httpd.requests

    def __enter__(self) -> "FakeOpenAIServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
