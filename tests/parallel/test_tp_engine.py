"""Tensor parallelism through the engine on CPU: rank 0 in this process, rank 1 a gloo worker.

Greedy output of TP=2 must equal TP=1 token for token (logprobs agree up to float32 summation
order), the workers must go away when the engine stops, when rank 0 dies, and a dead worker must
end requests with an error instead of hanging.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from proc_helpers import pid_alive, wait_until

from tritongen.entrypoints.async_engine import AsyncLLM, EngineDeadError
from tritongen.entrypoints.llm import LLM
from tritongen.fetch import resolve_model
from tritongen.models.loader import hf_config_dict, load_model
from tritongen.types import SamplingParams

SRC = str(Path(__file__).resolve().parents[2] / "src")
PROMPTS = [list(range(1, 30)), [5, 9, 200, 7], list(range(300, 341))]
GREEDY = SamplingParams(max_tokens=10, temperature=0.0, logprobs=2)
# Small blocks and budget: chunked prefill and preemption both happen in the TP=2 run as well.
ENGINE = dict(num_blocks=24, block_size=4, max_num_batched_tokens=32, max_num_seqs=4)


def _wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    wait_until(lambda: not any(pid_alive(p) for p in pids), timeout)
    return [p for p in pids if pid_alive(p)]


def _run(model: str, tp: int, **kw) -> list:
    with LLM(model, tensor_parallel_size=tp, **ENGINE, **kw) as llm:
        return llm.generate(PROMPTS, GREEDY)


def _assert_same(single: list, split: list) -> None:
    assert [o.token_ids for o in split] == [o.token_ids for o in single]
    for a, b in zip(single, split):
        assert len(a.token_ids) == GREEDY.max_tokens
        lp_a = [lp.logprob for lp in a.logprobs]
        lp_b = [lp.logprob for lp in b.logprobs]
        assert max(abs(x - y) for x, y in zip(lp_a, lp_b)) < 1e-3


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-llama-mha", "tiny-qwen2"])  # GQA, MHA+tied, bias
def test_tp2_greedy_equals_tp1(preset: str) -> None:
    _assert_same(_run(f"dummy:{preset}", 1), _run(f"dummy:{preset}", 2))


def test_tp2_with_asynchronous_scheduling_equals_tp1() -> None:
    """The pipelined loop with steps fed on the device, forced on over gloo: rank 0 broadcasts the
    ids it sampled to the worker, which decodes the same tokens."""
    single = _run("dummy:tiny-llama", 1)
    with LLM("dummy:tiny-llama", tensor_parallel_size=2, **ENGINE) as llm:
        assert llm.engine.runner.supports_input_from_previous
        llm.engine.pipelined = llm.engine.async_scheduling = True
        launched = []
        launch = llm.engine.runner.launch
        llm.engine.runner.launch = lambda sched: launched.append(sched.input_from_previous) or launch(sched)
        split = llm.generate(PROMPTS, GREEDY)
    assert any(launched)
    _assert_same(single, split)


def test_tp2_loads_each_rank_slice_from_a_checkpoint(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    net, arch = load_model("dummy:tiny-llama", torch.float32, torch.device("cpu"), seed=3)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(hf_config_dict("dummy:tiny-llama")))
    tokenizer = resolve_model(None)
    single = _run(str(tmp_path), 1, tokenizer=tokenizer)
    with LLM(str(tmp_path), tensor_parallel_size=2, tokenizer=tokenizer, **ENGINE) as llm:
        q = llm.engine.runner.runner.model.model.layers[0].self_attn.q_proj.weight
        assert q.shape == (arch.num_attention_heads // 2 * arch.head_dim, arch.hidden_size)
        torch.testing.assert_close(q, net.model.layers[0].self_attn.q_proj.weight[: q.shape[0]])
        split = llm.generate(PROMPTS, GREEDY)
    _assert_same(single, split)


def test_workers_exit_when_the_engine_stops() -> None:
    llm = LLM("dummy:tiny-llama", tensor_parallel_size=2, disable_custom_all_reduce=True, **ENGINE)
    assert not llm.engine.runner.runner.shard.custom_all_reduce  # NCCL (here gloo) for every all-reduce
    pids = llm.engine.runner.worker_pids
    assert len(pids) == 1 and pid_alive(pids[0])
    llm.shutdown()
    assert _wait_gone(pids) == []
    llm.shutdown()  # idempotent


def test_a_dead_worker_fails_requests_instead_of_hanging() -> None:
    async def scenario() -> tuple[list, BaseException]:
        llm = AsyncLLM("dummy:tiny-llama", tensor_parallel_size=2, **ENGINE)
        pid = llm.engine.runner.worker_pids[0]
        outs = []
        try:
            async for out in llm.generate(list(range(1, 20)), SamplingParams(max_tokens=2000, ignore_eos=True)):
                outs.append(out)
                if len(outs) == 3:
                    os.kill(pid, signal.SIGKILL)  # mid-generation: rank 0 is in or near a collective
            with pytest.raises(EngineDeadError) as later:  # the engine stays dead, it does not hang
                async for _ in llm.generate([1, 2, 3], SamplingParams(max_tokens=4)):
                    pass
            return outs, later.value
        finally:
            llm.shutdown()

    outs, later = asyncio.run(asyncio.wait_for(scenario(), timeout=120))
    assert outs[-1].finished and outs[-1].error is not None
    assert "worker rank 1" in outs[-1].error or "onnection" in outs[-1].error, outs[-1].error
    assert "worker rank 1" in str(later)


def test_workers_exit_when_rank0_is_killed(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from tritongen.entrypoints.llm import LLM\n"
        "llm = LLM('dummy:tiny-llama', tensor_parallel_size=2, num_blocks=16, block_size=4)\n"
        "print(*llm.engine.runner.worker_pids, flush=True)\n"
        "time.sleep(600)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p)}
    rank0 = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pids = [int(p) for p in rank0.stdout.readline().split()]
        assert pids and all(pid_alive(p) for p in pids)
    finally:
        rank0.kill()
        rank0.wait()
    assert _wait_gone(pids) == []


@pytest.mark.parametrize("kw, message", [
    (dict(model="dummy:tiny-llama", tensor_parallel_size=3), "num_attention_heads 4 is not divisible"),
    (dict(model="dummy:tiny-llama", tensor_parallel_size=8), "larger than num_attention_heads"),
    (dict(model="dummy:tiny-llama", tensor_parallel_size=2, device="cuda:1"), "CUDA|cuda"),
])
def test_impossible_tensor_parallel_configs_are_refused(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LLM(**kw, num_blocks=16)
