"""Model implementations (plain PyTorch, HF parameter names), their configs and the loader."""
