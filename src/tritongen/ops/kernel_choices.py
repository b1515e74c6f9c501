"""The kernel choices of one engine (`KernelChoices`) and which apply in this thread: the engine's
runner makes its own active around its forward passes (`active`), so two engines in one process
keep their own; outside any `active` block the process default applies, which `use_triton` sets.
Apart from ops/kernels.py (the dispatch) so that the Triton launch helpers read them too
(ops/triton_pdl.py) without importing the dispatch. Pure Python."""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Iterator, Optional


@dataclass
class KernelChoices:
    """The kernels of one engine's model (CUDA tensors; CPU tensors always take the reference)."""

    triton: bool = False
    """The Triton per-token kernels and, where `gemm` / `gated` say so, the skinny GEMMs."""
    gemm: dict = field(default_factory=dict)
    """(N, K, dtype, row bucket) -> skinny GEMM configuration, or None for cuBLAS (select_kernels)."""
    gated: dict = field(default_factory=dict)
    """(2N, K, dtype, row bucket) -> fused gate/up + SiLU·mul configuration, or None (select_gated_kernels)."""
    pdl: bool = False
    """Programmatic dependent launch of the decode step's Triton kernels (ops/triton_pdl.py)."""


_default = KernelChoices()
_active: ContextVar[Optional[KernelChoices]] = ContextVar("tritongen_kernel_choices", default=None)


def use_triton(enabled: bool) -> None:
    """The process default outside any `active` block (no skinny GEMM choices of its own)."""
    _default.triton = enabled


@contextlib.contextmanager
def active(choices: KernelChoices) -> Iterator[KernelChoices]:
    """Dispatch with `choices` in this thread (and its context) until the block ends."""
    token = _active.set(choices)
    try:
        yield choices
    finally:
        _active.reset(token)


def current() -> KernelChoices:
    choices = _active.get()
    return _default if choices is None else choices
