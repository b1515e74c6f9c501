"""Triton Inference Server backend: the tensor codec, the Python-backend model bodies, the
repository builder and the launcher of a real tritonserver.

Nothing here imports triton_python_backend_utils at import time: the model bodies receive it in
`initialize`, and the codec takes it as an argument, so everything is importable (and testable
with a fake) outside Triton.
"""
