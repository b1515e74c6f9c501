import os
import sys

# Tests import the package from the source tree even when it is not installed. pytest runs in
# importlib mode (pyproject.toml) so that tests/ never lands on sys.path: tests/triton would
# otherwise shadow the real `triton` package that torch probes for.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
# Helper modules (fakes.py, triton_helpers.py, oai_helpers.py, ...) import by their own names.
_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in sorted(os.listdir(_HERE)):
    if os.path.isdir(os.path.join(_HERE, _sub)) and not _sub.startswith((".", "_")):
        sys.path.insert(0, os.path.join(_HERE, _sub))

# Without CUDA, Triton kernels run in Triton's interpreter (tests/gpu/test_triton_kernels.py). The
# switch must be set before anything imports triton: it decides how @triton.jit builds functions.
import importlib.util  # noqa: E402

if "TRITON_INTERPRET" not in os.environ and importlib.util.find_spec("triton") is not None:
    import torch  # noqa: E402

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

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
