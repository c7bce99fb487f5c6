"""Free TCP ports for servers a test starts on loopback."""

from __future__ import annotations

import socket


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port on `address` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        port: int = sock.getsockname()[1]
        return port
