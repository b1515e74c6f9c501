"""Parallelism applied to a model after it is built, so model files stay single-device.

tensor_parallel: Megatron-style sharding of every family over torch.distributed ranks (tp_plans: what
splits per family; tp_layers: the rank's modules).
"""
