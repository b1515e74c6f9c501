"""The engine's pure-Python core: scheduling, KV-block bookkeeping, detokenization.

Never imports torch (tests/unit/test_core_pure.py enforces it), so it is testable in milliseconds.
"""
