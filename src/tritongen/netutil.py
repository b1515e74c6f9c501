"""Free TCP ports on 127.0.0.1 (servers in tests and benchmarks, the tensor-parallel rendezvous)."""
from __future__ import annotations

import socket


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports that were free a moment ago (all bound at once, so they differ)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
