"""Fixtures: one tiny-model engine (random weights, SmolLM2's tokenizer and chat template) and one
server over it for the whole session."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # oai_helpers (pytest runs in importlib mode)

from oai_helpers import MODEL, ServerThread, make_engine


@pytest.fixture(scope="session")
def engine():
    llm = make_engine()
    yield llm
    llm.shutdown()


@pytest.fixture(scope="session")
def server(engine):
    from tritongen.openai.server import build_app

    srv = ServerThread(build_app(engine, served_model_name=MODEL, max_body_bytes=1 << 20))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
