import os
import sys

# Tests import the package from the source tree even when it is not installed.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))

import pytest


@pytest.fixture(scope="session")
def default_model_dir() -> str:
    """The real SmolLM2-135M-Instruct as an HF directory (fetched and converted once; CI does it
    in .ci/run before the tests)."""
    from tritongen.fetch import fetch_default_model

    return str(fetch_default_model())


@pytest.fixture(scope="session")
def tokenizer(default_model_dir):
    from tritongen.tokenizer import load_tokenizer

    return load_tokenizer(default_model_dir)
