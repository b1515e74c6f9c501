"""The triton-grpc target against a fake gRPC endpoint: the stream pool, routing, errors, close."""
import asyncio
import json

import pytest

pytest.importorskip("grpc")
pytest.importorskip("tritonclient.grpc")

from fake_triton_grpc import FakeTritonGrpcServer, decode_inputs  # noqa: E402

from tritongen.bench.datasets import BenchRequest  # noqa: E402
from tritongen.bench.loadgen import LoadShape, run_serve_benchmark  # noqa: E402
from tritongen.bench.target_kinds import make_target  # noqa: E402
from tritongen.bench.targets import TargetError, sampling_fields  # noqa: E402
from tritongen.bench.triton_grpc import TritonGrpcTarget, stream_count  # noqa: E402


def _requests(prompts, out: int = 3) -> list[BenchRequest]:
    return [BenchRequest(p, 2, out) for p in prompts]


async def _collect(target: TritonGrpcTarget, req: BenchRequest):
    """(text, None) or (None, error message) of one request."""
    try:
        return "".join([c.text async for c in target.stream(req)]), None
    except TargetError as exc:
        return None, str(exc)


def _run_all(url: str, reqs, num_streams: int, then=()):
    """Send `reqs` at once, then `then` once they have finished; results in that order."""
    async def run():
        target = TritonGrpcTarget(url, None, None, 30.0, num_streams=num_streams)
        await target.start()
        try:
            first = await asyncio.gather(*(_collect(target, r) for r in reqs))
            return list(first) + [await _collect(target, r) for r in then]
        finally:
            await target.close()

    return asyncio.run(run())


def test_stream_count_default_and_argument():
    assert (stream_count(128), stream_count(4), stream_count(None)) == (32, 4, 32)
    assert stream_count(128, num_streams=5) == 5
    assert len(make_target("triton-grpc", None, None, None, 64, 1.0).pool) == 32
    assert len(make_target("triton-grpc", None, None, None, 64, 1.0, grpc_streams=3).pool) == 3
    with pytest.raises(ValueError):
        stream_count(8, num_streams=0)


def test_requests_spread_over_streams_each_on_its_own_connection():
    with FakeTritonGrpcServer(delay=0.02) as srv:
        results = _run_all(srv.url, _requests([f"p{i}" for i in range(8)]), num_streams=4)
        calls = list(srv.calls)
        first = decode_inputs(srv.requests[0])
        enable_empty_final = srv.requests[0].parameters["triton_enable_empty_final_response"].bool_param
    assert results == [(" t0 t1 t2", None)] * 8
    assert sorted(len(c.ids) for c in calls) == [2, 2, 2, 2]  # least-loaded
    assert len({c.peer for c in calls}) == 4
    req = _requests(["p"])[0]
    assert first["stream"] and first["exclude_input_in_output"] and first["return_num_output_tokens"]
    assert json.loads(first["sampling_parameters"]) == sampling_fields(req) and enable_empty_final


def test_an_error_response_fails_only_its_request():
    with FakeTritonGrpcServer(delay=0.05) as srv:
        results = _run_all(srv.url, _requests(["a", "FAIL", "c"]), num_streams=1)
    assert results[0] == results[2] == (" t0 t1 t2", None)
    assert results[1] == (None, "asked to fail")


def test_a_broken_stream_fails_only_its_own_requests_and_gets_no_new_one():
    with FakeTritonGrpcServer(delay=0.1) as srv:
        reqs = _requests(["BREAK", "b", "c", "d"], out=5)
        results = _run_all(srv.url, reqs, num_streams=2, then=_requests(["e"]))
        broken = srv.call_of("bench-0")
    failed = [f"bench-{i}" for i, (_, err) in enumerate(results) if err is not None]
    assert failed == broken.ids and len(failed) == 2  # BREAK and the request beside it
    assert all("INTERNAL" in results[int(rid[6:])][1] for rid in failed)
    assert sum(err is None for _, err in results) == 3 and results[-1] == (" t0 t1 t2", None)


def test_close_cancels_every_stream_and_fails_what_is_in_flight():
    async def run(srv):
        target = TritonGrpcTarget(srv.url, None, None, 30.0, num_streams=2)
        await target.start()
        gen = target.stream(_requests(["long"], out=100)[0])
        first = await gen.__anext__()
        await target.close()
        with pytest.raises(TargetError, match="cancelled"):
            await gen.__anext__()
        return first

    with FakeTritonGrpcServer(delay=0.05) as srv:
        assert asyncio.run(run(srv)).text == " t0"
        assert all(c.ended.wait(5) for c in srv.calls) and len(srv.calls) == 2


def test_serve_benchmark_records_timelines_through_the_pool():
    with FakeTritonGrpcServer(delay=0.01) as srv:
        target = make_target("triton-grpc", srv.url, None, None, 4, 30.0)
        records, _ = asyncio.run(run_serve_benchmark(target, _requests([f"p{i}" for i in range(12)], out=4),
                                                     LoadShape(concurrency=4), progress=False))
    assert len(target.pool) == 4
    for r in records:
        assert r.ok and r.num_output_tokens == 4 and len(r.itl) == 3 and 0 < r.ttft < r.latency
