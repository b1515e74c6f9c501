"""Model implementations (plain PyTorch, HF parameter names), their configs and the loader."""
# Registers the Baichuan, Gemma and Phi-3 config.json parsers with ModelArch (pure Python, no torch),
# so that every import of tritongen.models.arch sees all of SUPPORTED_ARCHITECTURES.
from tritongen.models import arch_dense  # noqa: F401
