"""Accuracy: parity against HF transformers on the same weights, and task accuracy (`tritongen eval`)."""
