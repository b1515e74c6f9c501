"""A fake Triton gRPC endpoint (grpcio, threads) speaking just ModelStreamInfer, for the triton-grpc target.

Each request gets max_tokens responses " t0", " t1", ... `delay` seconds apart (num_output_tokens 1
each), then an empty response flagged triton_final_response, as enable_empty_final_response asks.
A prompt containing "FAIL" gets one error response naming its request (as tritonserver does); one
containing "BREAK" aborts the whole call after 0.2 s. Every call is recorded: its peer (one per
connection), the ids of the requests it carried, whether it has ended.
"""
from __future__ import annotations

import json
import queue
import struct
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

_BREAK = object()


@dataclass
class Call:
    peer: str
    ids: list = field(default_factory=list)
    """Request ids in arrival order."""
    ended: threading.Event = field(default_factory=threading.Event)


def decode_inputs(req) -> dict:
    """name -> value of a ModelInferRequest's scalar BYTES / BOOL raw inputs."""
    values = {}
    for spec, raw in zip(req.inputs, req.raw_input_contents):
        if spec.datatype == "BOOL":
            values[spec.name] = raw == b"\x01"
        else:
            (n,) = struct.unpack_from("<I", raw)
            values[spec.name] = raw[4:4 + n].decode()
    return values


def _response(rid: str, text=None, final: bool = False, error: str = ""):
    r = service_pb2.ModelInferResponse(id=rid, model_name="llm")
    r.parameters["triton_final_response"].bool_param = final
    if text is not None:
        data = text.encode()
        r.outputs.add(name="text_output", datatype="BYTES", shape=[1])
        r.outputs.add(name="num_output_tokens", datatype="UINT32", shape=[1])
        r.raw_output_contents.extend([struct.pack("<I", len(data)) + data, struct.pack("<I", 1)])
    return service_pb2.ModelStreamInferResponse(error_message=error, infer_response=r)


class _Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, server: "FakeTritonGrpcServer") -> None:
        self.server = server

    def ModelStreamInfer(self, request_iterator, context):
        call = Call(context.peer())
        context.add_callback(call.ended.set)
        self.server.calls.append(call)
        out: queue.Queue = queue.Queue()

        def read() -> None:
            try:
                for req in request_iterator:
                    call.ids.append(req.id)
                    self.server.requests.append(req)
                    threading.Thread(target=self.server.serve, args=(req, out), daemon=True).start()
            except grpc.RpcError:  # the call ended (cancelled by the client, or aborted)
                pass

        threading.Thread(target=read, daemon=True).start()
        while context.is_active():
            try:
                item = out.get(timeout=0.05)
            except queue.Empty:
                continue
            if item is _BREAK:
                context.abort(grpc.StatusCode.INTERNAL, "stream broken on purpose")
            yield item


class FakeTritonGrpcServer:
    """Context manager on 127.0.0.1: `url`, `calls` (one Call per stream), `requests` received."""

    def __init__(self, delay: float = 0.01) -> None:
        self.delay = delay
        self.calls: list[Call] = []
        self.requests: list = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_Servicer(self), self.server)
        self.url = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"

    def serve(self, req, out: queue.Queue) -> None:
        inputs = decode_inputs(req)
        if "FAIL" in inputs["text_input"]:
            return out.put(_response(req.id, final=True, error="asked to fail"))
        if "BREAK" in inputs["text_input"]:
            time.sleep(0.2)
            return out.put(_BREAK)
        for i in range(json.loads(inputs["sampling_parameters"])["max_tokens"]):
            time.sleep(self.delay)
            out.put(_response(req.id, f" t{i}"))
        out.put(_response(req.id, final=True))

    def call_of(self, rid: str) -> Call:
        return next(c for c in self.calls if rid in c.ids)

    def __enter__(self) -> "FakeTritonGrpcServer":
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop(grace=None)
