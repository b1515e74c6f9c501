"""Errors of the Triton models: TritonError responses, the FINAL send, and the codes a forwarding
model answers with (python_backend 24.10 loses the code of a BLS error, so the engine model tags
its messages with it). Clients see these through codec, which re-exports them."""
from __future__ import annotations

import logging

from tritongen.triton.values import InvalidInput

logger = logging.getLogger(__name__)

# Request parameter set by forwarding models: BLS responses of python_backend 24.10 lose the error
# code (every error arrives as INTERNAL), so the engine model writes it into the message as well.
TAG_ERRORS = "tritongen_tag_errors"
_ERROR_CODES = ("INVALID_ARG", "CANCELLED", "UNAVAILABLE", "INTERNAL")


def error_response(pb, message: str, code: str = "INVALID_ARG", tag: bool = False):
    """A response carrying pb.TritonError(message, code); code is a TritonError attribute name.
    With `tag`, the message starts with "[CODE] " for a forwarding model to restore the code."""
    if tag:
        message = f"[{code}] {message}"
    return pb.InferenceResponse(output_tensors=[], error=pb.TritonError(message, getattr(pb.TritonError, code)))


def send_final(sender, response, flag: int) -> None:
    """End a request: `response` with the FINAL `flag` (None: the flag alone). If sending the
    response fails (e.g. the client is gone), the flag alone still closes the request."""
    try:
        if response is None:
            sender.send(flags=flag)
        else:
            sender.send(response, flags=flag)
    except Exception:
        try:
            sender.send(flags=flag)
        except Exception:
            logger.debug("could not send the final response", exc_info=True)


def untag_error(message: str) -> tuple[str, str]:
    """(code, message) from a tagged message; untagged ones are INTERNAL."""
    for code in _ERROR_CODES:
        if message.startswith(f"[{code}] "):
            return code, message[len(code) + 3:]
    return "INTERNAL", message


_UNAVAILABLE_HINTS = ("is not ready", "unknown model", "not found", "is not healthy", "unavailable",
                      "shutting down")


def forward_error_code(message: str) -> str:
    """The code a forwarding model answers with for an error that Triton, not the engine model,
    gave its inner request: UNAVAILABLE when the model is not there (not loaded, being reloaded,
    its stub dead) — a server fault, never the client's —, else INTERNAL."""
    lowered = message.lower()
    return "UNAVAILABLE" if any(hint in lowered for hint in _UNAVAILABLE_HINTS) else "INTERNAL"


def error_code_for(exc: BaseException) -> str:
    """TritonError code name for an exception raised while serving a request."""
    if isinstance(exc, InvalidInput) or type(exc) is ValueError:
        return "INVALID_ARG"
    if type(exc).__name__ == "EngineDeadError":
        return "UNAVAILABLE"
    return "INTERNAL"
