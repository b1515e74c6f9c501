"""Benchmarks: datasets, load generator, metrics, roofline, and the `tritongen bench` commands."""
