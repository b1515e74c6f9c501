"""A stand-in for triton_python_backend_utils: just what the codec and the model bodies use."""
from __future__ import annotations

import json
from typing import Optional

import numpy as np

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class TritonError(Exception):
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class Tensor:
    def __init__(self, name: str, array) -> None:
        self._name, self._array = name, np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class InferenceResponse:
    def __init__(self, output_tensors=(), error: Optional[TritonError] = None) -> None:
        self._tensors, self._error = list(output_tensors), error

    def output_tensors(self) -> list[Tensor]:
        return self._tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> Optional[TritonError]:
        return self._error

    def get(self, name: str) -> np.ndarray:
        return next(t.as_numpy() for t in self._tensors if t.name() == name)

    def names(self) -> set[str]:
        return {t.name() for t in self._tensors}


class InferenceRequest:
    def __init__(self, inputs: dict, parameters: Optional[dict] = None, request_id: str = "") -> None:
        self._inputs = {k: Tensor(k, v) for k, v in inputs.items()}
        self._parameters = json.dumps(parameters or {})
        self._request_id = request_id

    def inputs(self) -> list[Tensor]:
        return list(self._inputs.values())

    def parameters(self) -> str:
        return self._parameters

    def request_id(self) -> str:
        return self._request_id


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Optional[Tensor]:
    return request._inputs.get(name)


def text(value: str) -> np.ndarray:
    return np.array([value.encode("utf-8")], dtype=np.object_)
