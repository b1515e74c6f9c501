"""Programmatic dependent launch (PDL, Hopper and later) for the Triton kernels of a decode step.

A decode step is a chain of short kernels, each reading what the one before wrote. Launched
plainly, a kernel's programs start only once the previous kernel has finished, so each boundary
pays the launch and the first loads' latency with the GPU idle, and the one-program kernels of a
batch-1 step (the RMSNorms, SiLU·mul) leave 131 of 132 SMs and nearly all of HBM idle while they
run. Launched with PDL, a kernel may start as soon as every program of the one before has called
`griddepcontrol.launch_dependents`; its programs then block at `griddepcontrol.wait` until that
kernel has completed and its writes are visible. Before the wait a program touches only memory no
kernel of the step writes: the GEMMs ask L2 for the first bytes of their weight rows there
(`prefetch_rows`), so the weight stream starts while the previous kernel is still running.

Rules every kernel launched with PDL here keeps:
- it calls `await_inputs` before it reads or writes anything a kernel writes (activations, the KV
  cache, split-K counters and partials, the attention metadata): a kernel that waits has let the
  one before it complete, which waited on its own predecessor, so everything before is complete;
- it signals its dependents in `await_inputs`, after the wait, so at most one kernel runs ahead.
Kernels launched plainly need neither; a plain launch after a PDL kernel waits for it as usual.

`launch(t)` gives a launch's keyword arguments: PDL on for CUDA tensors while the engine's
KernelChoices.pdl is set (the runner sets it for devices of compute capability 9.0 and up, from
ModelConfig.pdl), off elsewhere (the CPU interpreter of the GPU tests has no inline assembly).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tritongen.ops.kernel_choices import current

PREFETCH_BYTES = tl.constexpr(1024)
"""Bytes of each weight row a GEMM program asks L2 for before its wait: the first K steps of its
slab. Large enough to keep HBM busy through the one-program kernels before a GEMM (a 7B qkv's 12,288
rows: 12.6 MB, ~4 µs at 3 TB/s), small enough that the whole layer's prefetch fits in L2 twice."""


def launch(t: torch.Tensor) -> dict:
    """{PDL, launch_pdl} for a kernel launch over CUDA tensor t (see the module docstring)."""
    on = bool(t.is_cuda and current().pdl)
    return {"PDL": on, "launch_pdl": on}


def supported(device: torch.device) -> bool:
    """PDL needs compute capability 9.0 (Hopper) or later."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


@triton.jit
def await_inputs(PDL: tl.constexpr):
    """Wait for the previous kernel to complete, then let the next one launch (PDL only)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def prefetch_rows(W, rows, stride_row, k_start, k_end, PDL: tl.constexpr, PREFETCH: tl.constexpr):
    """Ask L2 for the first bytes (up to PREFETCH_BYTES) of [k_start, k_end) of each row `rows` (1-D,
    in range) of W: one bulk prefetch per row, nothing waits for it. PREFETCH: `prefetchable(W)`."""
    if PDL and PREFETCH:
        nbytes = tl.minimum((k_end - k_start) * (W.dtype.element_ty.primitive_bitwidth // 8), PREFETCH_BYTES)
        ptrs = W + rows.to(tl.int64) * stride_row + k_start
        tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2; // dummy $0", "=r,l,r",
                                  [ptrs, tl.zeros(rows.shape, tl.int32) + nbytes], dtype=tl.int32, is_pure=False,
                                  pack=1)


def prefetchable(w: torch.Tensor) -> bool:
    """Whether prefetch_rows may run on weight w [N, K]: bulk prefetches take 16-byte aligned ranges
    of multiples of 16 bytes, so the base, the row stride and K in bytes must be multiples of 16 (the
    slices start at multiples of BLOCK_K elements)."""
    size = w.element_size()
    return w.data_ptr() % 16 == 0 and (w.stride(0) * size) % 16 == 0 and (w.shape[-1] * size) % 16 == 0
