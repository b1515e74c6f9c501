"""The example clients in clients/python, each run as a script against the session's tritonserver."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

CLIENTS = Path(__file__).resolve().parents[2] / "clients" / "python"


def run_client(name: str, *args: str) -> str:
    out = subprocess.run([sys.executable, str(CLIENTS / name), *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_stream_client_prints_tokens_and_ttft(triton):
    out = run_client("triton_stream_client.py", "--url", triton.grpc, "--max-tokens", "6", "--ignore-eos",
                     "The quick brown fox")
    streamed, _, tail = out.partition("\nTTFT: ")
    assert streamed.strip(), out
    assert re.match(r"\d+\.\d ms\ntotal: \d+\.\d ms, [1-6] text responses\n$", tail), out


def test_http_client_generate_and_infer(triton):
    out = run_client("triton_http_client.py", "--url", triton.http, "--max-tokens", "6", "--ignore-eos",
                     "The quick brown fox")
    answers = dict(re.findall(r"^(generate|infer) \(\d+\.\d ms\): (.+)$", out, re.M))
    assert set(answers) == {"generate", "infer"} and answers["generate"] == answers["infer"], out


@pytest.mark.parametrize("model", ["llm_bls", "llm"])
def test_async_client_concurrent_requests(triton, model):
    out = run_client("triton_async_client.py", "--url", triton.grpc, "--model", model, "-n", "8", "--max-tokens",
                     "4", "--ignore-eos", "The quick brown fox")
    texts = re.findall(r"^request (\d+): \d+\.\d ms '(.+)'$", out, re.M)
    assert sorted(int(i) for i, _ in texts) == list(range(8)), out
    assert len({t for _, t in texts}) == 1  # greedy: the same prompt, the same answer
    assert re.search(r"^8/8 requests in \d+\.\d+ s: \d+\.\d+ requests/s$", out, re.M), out
