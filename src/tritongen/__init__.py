"""tritongen: fast LLM serving in Python, first-class on NVIDIA Triton Inference Server.

Imports are lazy so that `import tritongen.core` does not pull in torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["LLM", "AsyncLLM", "SamplingParams", "RequestOutput"]

if TYPE_CHECKING:
    from tritongen.entrypoints.async_engine import AsyncLLM
    from tritongen.entrypoints.llm import LLM
    from tritongen.types import RequestOutput, SamplingParams

_LAZY = {
    "LLM": "tritongen.entrypoints.llm",
    "AsyncLLM": "tritongen.entrypoints.async_engine",
    "SamplingParams": "tritongen.types",
    "RequestOutput": "tritongen.types",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tritongen' has no attribute {name!r}")
