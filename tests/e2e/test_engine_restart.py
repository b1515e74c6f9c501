"""Failure paths of AsyncLLM with the fault injected (issue 21, item 4):
- an exception inside a step fails only that step's requests (finish_reason "error", error set);
  requests waiting outside it finish with their normal output, and every block is freed;
- steps failing in a row give the engine up: in-flight requests get EngineDeadError at once, new
  ones too, is_running is False; the engine is rebuilt and serves again (engine_restarts);
- kill -9 of the engine process: in-flight requests fail within a second, a new process is
  spawned, and a greedy request gives the reference output again.
"""
import asyncio
import os
import signal
import threading
import time

import pytest

from tritongen import AsyncLLM, SamplingParams
from tritongen.entrypoints.async_engine import EngineDeadError
from tritongen.entrypoints.engine_loop import MAX_CONSECUTIVE_FAILURES

OPTS = dict(dtype="float32", device="cpu", num_blocks=128)
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
LONG = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)


async def final_or_error(llm, prompt, params, rid=None):
    try:
        return [o async for o in llm.generate(prompt, params, rid)][-1]
    except EngineDeadError as exc:
        return exc


def collect(llm, prompt, params):
    return asyncio.run(final_or_error(llm, prompt, params))


def wait_running(llm, timeout=90.0):
    deadline = time.monotonic() + timeout
    while not llm.is_running:
        assert time.monotonic() < deadline, llm.health()
        time.sleep(0.05)


def inject(monkeypatch, engine, when):
    """engine.runner.execute raises RuntimeError("injected") for steps where when(sched) is true;
    the ids of the requests of those steps are recorded."""
    real, failed = engine.runner.execute, []

    def execute(sched):
        if when(sched):
            failed.append([s.request_id for s in sched.seqs])
            raise RuntimeError("injected")
        return real(sched)
    monkeypatch.setattr(engine.runner, "execute", execute)
    return failed


@pytest.fixture
def llm():
    engine = AsyncLLM("dummy:tiny-llama", max_num_seqs=2, **OPTS)
    yield engine
    engine.shutdown()


def test_a_failing_step_fails_only_its_own_requests(llm, monkeypatch):
    reference = collect(llm, [7, 8, 9], GREEDY).token_ids
    failed = inject(monkeypatch, llm.engine, lambda sched: any(
        s.request_id == "a" and len(s.output_token_ids) == 2 for s in sched.seqs))

    async def run():
        return await asyncio.gather(final_or_error(llm, [1, 2, 3], LONG, "a"),
                                    final_or_error(llm, [4, 5, 6], LONG, "b"),
                                    final_or_error(llm, [7, 8, 9], GREEDY, "c"))  # waits: max_num_seqs=2

    outs = {o.request_id: o for o in asyncio.run(run())}
    assert len(failed) == 1 and "a" in failed[0] and "c" not in failed[0]
    for rid, out in outs.items():
        if rid in failed[0]:
            assert (out.finish_reason, out.error) == ("error", "RuntimeError: injected")
        else:
            assert out.finish_reason == "length" and out.error is None
    assert outs["c"].token_ids == reference
    st = llm.stats()
    assert st["kv_blocks_free"] == st["kv_blocks_total"] and st["num_failed_steps"] == 1
    assert llm.is_running and st["engine_restarts"] == 0


def test_steps_failing_in_a_row_restart_the_engine(llm, monkeypatch):
    reference = collect(llm, [7, 8, 9], GREEDY).token_ids
    inject(monkeypatch, llm.engine, lambda sched: True)
    gate, build = threading.Event(), llm._build

    def slow_build():  # hold the rebuild until the test has looked at the engine while it is down
        assert gate.wait(60)
        return build()
    monkeypatch.setattr(llm, "_build", slow_build)

    async def run():  # max_num_seqs=2: the 3 failed steps end at most 6 of them with "error"
        return await asyncio.gather(*(final_or_error(llm, [i + 1, 2], LONG) for i in range(8)))

    outs = asyncio.run(run())
    errors = [o for o in outs if not isinstance(o, EngineDeadError)]
    assert errors and all(o.finish_reason == "error" for o in errors)
    assert len(errors) < len(outs)  # the rest were in flight when the engine was given up
    assert llm.stats()["num_failed_steps"] == MAX_CONSECUTIVE_FAILURES
    assert not llm.is_running and llm.health()["running"] is False and "injected" in llm.health()["error"]
    start = time.monotonic()
    assert isinstance(collect(llm, "new", GREEDY), EngineDeadError)
    assert time.monotonic() - start < 0.5
    asyncio.run(llm.abort("unknown-id"))  # a no-op while down, and it does not wait
    gate.set()
    wait_running(llm)
    assert llm.stats()["engine_restarts"] == 1 and llm.health()["error"] is None
    assert collect(llm, [7, 8, 9], GREEDY).token_ids == reference
    asyncio.run(llm.abort("unknown-id"))  # a no-op while up too


def test_kill_9_of_the_engine_process_fails_in_flight_requests_and_respawns():
    llm = AsyncLLM("dummy:tiny-llama", engine_process=True, **OPTS)
    procs = [llm.engine.proc]
    try:
        reference = collect(llm, [7, 8, 9], GREEDY).token_ids
        first_pid = llm.engine_pid

        async def run():
            gens = [llm.generate([i + 1, 5, 6], SamplingParams(max_tokens=100000 // 1000, ignore_eos=True))
                    for i in range(3)]
            for g in gens:
                await g.__anext__()
            os.kill(first_pid, signal.SIGKILL)
            killed = time.monotonic()

            async def drain(g):
                with pytest.raises(EngineDeadError, match="engine process exited"):
                    async for _ in g:
                        pass
                return time.monotonic() - killed
            return await asyncio.gather(*(drain(g) for g in gens))

        delays = asyncio.run(run())
        assert max(delays) < 1.0, delays
        assert isinstance(collect(llm, "during the restart", GREEDY), EngineDeadError) or llm.is_running
        wait_running(llm)
        procs.append(llm.engine.proc)
        assert llm.engine_pid != first_pid and llm.stats()["engine_restarts"] == 1
        assert collect(llm, [7, 8, 9], GREEDY).token_ids == reference
    finally:
        llm.shutdown()
    assert all(p.poll() is not None for p in procs)  # nothing outlives shutdown


def test_shutdown_while_the_engine_process_respawns_leaves_no_process():
    llm = AsyncLLM("dummy:tiny-llama", engine_process=True, **OPTS)
    first = llm.engine.proc
    os.kill(first.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while llm.engine.proc is first and llm.is_running and time.monotonic() < deadline:
        time.sleep(0.01)  # until the reader saw the death (a new child is loading)
    llm.shutdown()
    assert not llm._thread.is_alive() and not llm.is_running
    assert first.poll() is not None and not engine_children()
    assert isinstance(collect(llm, "after shutdown", GREEDY), EngineDeadError)


def engine_children() -> list[int]:
    """PIDs of live engine processes whose parent is this process."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, IndexError):
            continue
        if stat[1] == str(os.getpid()) and stat[0] != "Z" and b"engine_process" in cmd:
            pids.append(int(entry))
    return pids
