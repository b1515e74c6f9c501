"""The scale layouts of FP8 weights (ops/fp8.py's module docstring describes them); apart so that
the Triton kernels (ops/triton_fp8.py, ops/triton_fp8_quant.py) and the dispatcher (ops/fp8.py)
both read it, and the e4m3 range, without importing each other. Pure Python."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

SCALE_KINDS = ("channel", "tensor", "block")
E4M3_MAX = 448.0
"""The largest finite float8_e4m3fn value (torch.finfo(torch.float8_e4m3fn).max)."""
E4M3_MAX_RECIPROCAL = 1.0 / E4M3_MAX
"""A per-token scale is amax times this (as float32), not amax / E4M3_MAX: torch on CUDA divides a
tensor by a Python number as a multiplication by its float32 reciprocal, on CPU it divides, so only
the product is one value on every device and in the Triton kernels."""
MIN_SCALE = 1e-12
"""The scale of an all-zero row or token instead of 0 (no division by zero)."""


@dataclass(frozen=True)
class Fp8Scales:
    """How a weight's scales are laid out: `kind` one of SCALE_KINDS; `block` (bn, bk) for "block"."""

    kind: str
    block: Optional[tuple[int, int]] = None

    def __post_init__(self) -> None:
        if self.kind not in SCALE_KINDS:
            raise ValueError(f"fp8 scale layout must be one of {SCALE_KINDS}, got {self.kind!r}")
        if (self.kind == "block") != (self.block is not None):
            raise ValueError("a block size is given exactly for the 'block' scale layout")
        if self.block is not None and (len(self.block) != 2 or min(self.block) < 1):
            raise ValueError(f"fp8 block size must be two positive integers, got {self.block!r}")

    def shape(self, n: int, k: int) -> tuple[int, ...]:
        """The scale tensor's shape for an [n, k] weight."""
        if self.kind == "channel":
            return (n,)
        if self.kind == "tensor":
            return ()
        bn, bk = self.block
        return (math.ceil(n / bn), math.ceil(k / bk))
