"""Every model family behind the real tritonserver: one repository holding one decoupled engine
model per family (tiny presets, float32, CPU), loaded side by side; each answers a streamed gRPC
request and a `/generate` request with what the same engine generates in process."""
from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import triton_available
from triton_helpers import free_ports, generate, grpc_stream, stop_and_check, text, texts
from tritongen import LLM, SamplingParams

FAMILIES = ("tiny-qwen3", "tiny-gpt2", "tiny-bloom", "tiny-baichuan", "tiny-baichuan-13b", "tiny-gemma2",
            "tiny-gemma3", "tiny-phi3", "tiny-mixtral", "tiny-qwen3-moe")
PROMPT = "The capital of France is"
MAX_TOKENS = 8


def options(preset: str) -> dict:
    return {"model": f"dummy:{preset}", "dtype": "float32", "device": "cpu", "num_blocks": 64, "seed": 0,
            "max_num_seqs": 8}


def model_name(preset: str) -> str:
    return preset.replace("-", "_")


@pytest.fixture(scope="module")
def families_server(tmp_path_factory, default_model_dir):
    if not triton_available():
        pytest.skip("tritonserver (nvidia-pytriton) or tritonclient is not installed")
    from tritongen.triton.launcher import TritonServer
    from tritongen.triton.repo import write_repository

    root = tmp_path_factory.mktemp("families")
    for preset in FAMILIES:
        repo = write_repository(root / "repo", options(preset), name=model_name(preset))
    http, grpc, metrics = free_ports(3)
    server = TritonServer(repo, http_port=http, grpc_port=grpc, metrics_port=metrics, log_file=root / "server.log",
                          model_control="explicit", load_models=[model_name(p) for p in FAMILIES],
                          exit_timeout_s=30)
    server.start()
    try:
        server.wait_ready(timeout=float(os.environ.get("TRITONGEN_TEST_READY_TIMEOUT", "300")))
        yield server
    finally:
        stop_and_check(server, repo, (http, grpc, metrics))


@pytest.mark.parametrize("preset", FAMILIES)
def test_family_streams_over_grpc_and_answers_generate(families_server, preset):
    llm = LLM(**options(preset))
    want = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))[0]
    name = model_name(preset)
    inputs = {"text_input": text(PROMPT), "max_tokens": np.array([MAX_TOKENS], np.int32),
              "temperature": np.array([0.0], np.float32), "ignore_eos": np.array([True]), "stream": np.array([True])}
    results, finals = grpc_stream(families_server.grpc_url, name, inputs)
    assert finals == 1 and len(results) >= 2  # streamed: several responses, one FINAL
    assert "".join(texts(results)) == want.text
    body = {"text_input": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
    assert generate(families_server.http_url, name, body)["text_output"] == PROMPT + want.text  # vLLM's echo
    body["exclude_input_in_output"] = True
    assert generate(families_server.http_url, name, body)["text_output"] == want.text
