"""Parallelism applied to a model after it is built, so model files stay single-device.

tensor_parallel: Megatron-style sharding of the Llama family over torch.distributed ranks.
"""
