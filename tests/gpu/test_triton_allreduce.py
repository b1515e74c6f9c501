"""The fused all-reduce + residual add + RMSNorm kernel (ops/triton_allreduce.py) with two ranks
simulated in one process: each rank's buffer, flags and epochs are tensors of their own, and the
ranks run one after the other — rank 0 finds rank 1's signal already there (set by hand), rank 1
finds the one rank 0's kernel stored. Runs on CUDA, else in Triton's interpreter (as
test_triton_kernels.py); the real two-GPU run is tests/gpu/test_symmetric_allreduce.py."""
import importlib.util
import os

import pytest
import torch

INTERPRET = (os.environ.get("TRITONGEN_TEST_TRITON_INTERPRET") == "1" or os.environ.get("TRITON_INTERPRET") == "1"
             ) and importlib.util.find_spec("triton") is not None
if not (torch.cuda.is_available() or INTERPRET):
    pytest.skip("needs CUDA (or TRITONGEN_TEST_TRITON_INTERPRET=1)", allow_module_level=True)
pytest.importorskip("triton")

from tritongen.ops import reference  # noqa: E402
from tritongen.ops.triton_allreduce import allreduce_add_rms_norm  # noqa: E402

DEVICE = "cpu" if INTERPRET else "cuda"
SLOTS, MAX_ROWS, HIDDEN = 4, 9, 48


def _ranks(dtype):
    bufs = [torch.full((2, MAX_ROWS, HIDDEN), float("nan"), dtype=dtype, device=DEVICE) for _ in range(2)]
    flags = [torch.zeros(2, SLOTS, dtype=torch.int32, device=DEVICE) for _ in range(2)]
    epochs = [torch.zeros(SLOTS, dtype=torch.int32, device=DEVICE) for _ in range(2)]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64, device=DEVICE)
    flag_ptrs = torch.tensor([f.data_ptr() for f in flags], dtype=torch.int64, device=DEVICE)
    return bufs, flags, epochs, ptrs, flag_ptrs


def _assert_ranks_agree_with_the_sum(got, parts, residual, weight):
    """Both ranks' (normed, residual stream) equal the reference over the float32 sum of `parts`,
    rounded once: the residual stream to the bit, and the ranks to each other."""
    total = (parts[0].float() + parts[1].float()).to(residual.dtype)
    want_h, want_s = reference.add_rms_norm(total, residual, weight, 1e-6)
    for h, s in got:
        assert torch.equal(s, want_s)
        torch.testing.assert_close(h, want_h, atol=2e-2, rtol=2e-2)
    assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_ranks_sum_add_and_normalize_alike(dtype):
    if INTERPRET and dtype is torch.bfloat16:
        pytest.skip("the interpreter computes bf16 through numpy float32; covered on CUDA")
    g = torch.Generator().manual_seed(0)
    bufs, flags, epochs, ptrs, flag_ptrs = _ranks(dtype)
    weight = torch.randn(HIDDEN, generator=g).to(DEVICE, dtype)
    for call, rows in enumerate((3, 1, 4, 7, 9)):  # one row per program up to SLOTS rows, then a loop
        programs = min(rows, SLOTS)
        half = call % 2
        parts = [torch.randn(rows, HIDDEN, generator=g).to(DEVICE, dtype) for _ in range(2)]
        residual = torch.randn(rows, HIDDEN, generator=g).to(DEVICE, dtype)
        for r in range(2):
            bufs[r][half, :rows] = parts[r]
        flags[0][1, :programs] = epochs[0][:programs] + 1  # rank 1's signal, as if it had run first
        got = [allreduce_add_rms_norm(ptrs, flag_ptrs, epochs[r], half * MAX_ROWS * HIDDEN, rows, residual,
                                      weight, 1e-6, r) for r in range(2)]
        _assert_ranks_agree_with_the_sum(got, parts, residual, weight)
        # Rank 0 stored its epoch into rank 1's flags for (rank 0, program), for this call's programs.
        assert torch.equal(flags[1][0, :programs], epochs[0][:programs])
    assert epochs[0].tolist() == [5, 4, 4, 3] and torch.equal(epochs[0], epochs[1])


def test_rejects_empty_and_unaligned_rows():
    bufs, _, epochs, ptrs, flag_ptrs = _ranks(torch.bfloat16)
    residual = torch.zeros(2, HIDDEN, dtype=torch.bfloat16, device=DEVICE)
    weight = torch.ones(HIDDEN, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="at least one row"):
        allreduce_add_rms_norm(ptrs, flag_ptrs, epochs[0], 0, 0, residual[:0], weight, 1e-6, 0)
    with pytest.raises(ValueError, match="16-byte aligned"):
        allreduce_add_rms_norm(ptrs, flag_ptrs, epochs[0], 3, 1, residual[:1], weight, 1e-6, 0)


_LONELY_RANK = """
import torch
from tritongen.ops.triton_allreduce import allreduce_add_rms_norm
buf = torch.zeros(2, 1, 48, device="cuda")
flags = torch.zeros(2, 4, dtype=torch.int32, device="cuda")
ptrs = torch.tensor([buf.data_ptr()] * 2, dtype=torch.int64, device="cuda")
flag_ptrs = torch.tensor([flags.data_ptr()] * 2, dtype=torch.int64, device="cuda")
epoch = torch.zeros(4, dtype=torch.int32, device="cuda")
try:
    allreduce_add_rms_norm(ptrs, flag_ptrs, epoch, 0, 1, torch.zeros(1, 48, device="cuda"),
                           torch.ones(48, device="cuda"), 1e-6, 0, timeout_s=0.5)
    torch.cuda.synchronize()
except RuntimeError as exc:
    print("failed as it should:", exc)
    raise SystemExit(3)
"""


@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="the GPU clock; the interpreter has none")
def test_a_peer_that_never_signals_fails_the_kernel_instead_of_hanging():
    """A rank whose peer died must not spin forever: after its timeout the kernel traps and the
    host gets a CUDA error (in a subprocess: a trap ends the CUDA context)."""
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[2] / "src")  # the child imports this checkout's tritongen
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-c", _LONELY_RANK], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "failed as it should" in proc.stdout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lamport_two_ranks_push_poll_and_rotate_generations(dtype):
    """The Lamport form (ops/triton_lamport.py): rank 1's push is placed into rank 0's inbox by hand
    (as if it had run first); rank 0 reads it, pushes its own rows into rank 1's inbox and resets the
    generation it read a call before; rank 1 then finds rank 0's rows. Negative zeros travel as
    positive ones, so the sentinel never stands for data; both ranks get the same bits."""
    from tritongen.ops.triton_lamport import fill_sentinel, inbox_elements, lamport_add_rms_norm

    if INTERPRET and dtype is torch.bfloat16:
        pytest.skip("the interpreter computes bf16 through numpy float32; covered on CUDA")
    g = torch.Generator().manual_seed(3)
    cap, own_size = SLOTS, 2 * MAX_ROWS * HIDDEN  # inbox after the two halves of partial sums
    bufs = [torch.full((own_size + inbox_elements(2, cap, HIDDEN),), float("nan"), dtype=dtype, device=DEVICE)
            for _ in range(2)]
    for b in bufs:
        fill_sentinel(b[own_size:])
    inboxes = [b[own_size:].view(3, 2, cap, HIDDEN) for b in bufs]
    epochs = [torch.zeros(cap, dtype=torch.int32, device=DEVICE) for _ in range(2)]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64, device=DEVICE)
    weight = torch.randn(HIDDEN, generator=g).to(DEVICE, dtype)
    sentinel = torch.tensor(-0.0, dtype=dtype).view(torch.int16 if dtype is torch.bfloat16 else torch.int32)
    for call, rows in enumerate((3, 1, 4, 2, 4, 1, 3)):  # every slot goes through all three generations
        parts = [torch.randn(rows, HIDDEN, generator=g).to(DEVICE, dtype) for _ in range(2)]
        parts[0][0, :3] = -0.0
        residual = torch.randn(rows, HIDDEN, generator=g).to(DEVICE, dtype)
        sent = [torch.where(p == 0, torch.zeros_like(p), p) for p in parts]  # -0 -> +0, as pushed
        gens = (epochs[0][:rows] % 3).tolist()
        assert gens == (epochs[1][:rows] % 3).tolist()
        for r in range(2):
            bufs[r][:rows * HIDDEN] = parts[r].flatten()
        for row, gen in enumerate(gens):
            inboxes[0][gen, 1, row] = sent[1][row]
        got = [lamport_add_rms_norm(ptrs, epochs[0], 0, own_size, cap, rows, residual, weight, 1e-6, 0, 0)]
        for row, gen in enumerate(gens):
            assert torch.equal(inboxes[1][gen, 0, row], sent[0][row])  # rank 0's push, -0 as +0
            assert (inboxes[0][(gen + 2) % 3, 1, row].view(sentinel.dtype) == sentinel).all()  # reset
        got.append(lamport_add_rms_norm(ptrs, epochs[1], 0, own_size, cap, rows, residual, weight, 1e-6, 1, 0))
        _assert_ranks_agree_with_the_sum(got, sent, residual, weight)
    assert epochs[0].tolist() == [7, 5, 4, 2] and torch.equal(epochs[0], epochs[1])
    with pytest.raises(ValueError, match="1..4 rows"):
        lamport_add_rms_norm(ptrs, epochs[0], 0, own_size, cap, cap + 1, torch.zeros(cap + 1, HIDDEN, dtype=dtype,
                             device=DEVICE), weight, 1e-6, 0, 0)
