"""Health endpoints of the Controller, up from the start (a standby replica waiting for the
Lease is alive too, so it must not be restarted by its liveness probe):

- `GET /healthz`: 200 while the event loop answers and `alive` finds nothing wrong (the
  Controller's check of its watches once it leads), else 503 with the reason;
- `GET /readyz`: 200 once this replica leads and watches, 503 before;
- `GET /metrics`: the Prometheus metrics (when `metrics` is set).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

_log = logging.getLogger(__name__)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class HealthServer:
    """A minimal HTTP/1.1 server for the two probes."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.ready = False
        self.alive: Callable[[], str | None] = lambda: None
        self.metrics: Callable[[], bytes] | None = None
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen (port 0 picks a free port, then `self.port` tells which)."""
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        _log.info("health endpoints listening", extra={"address": f"{self.host}:{self.port}"})

    async def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            parts = request.decode(errors="replace").split()
            path = parts[1] if len(parts) >= 2 else ""
            if path == "/healthz":
                problem = self.alive()
                status, body = (
                    ("200 OK", "ok\n")
                    if problem is None
                    else ("503 Service Unavailable", problem + "\n")
                )
            elif path == "/readyz":
                status, body = (
                    ("200 OK", "ready\n")
                    if self.ready
                    else ("503 Service Unavailable", "not leading\n")
                )
            elif path == "/metrics" and self.metrics is not None:
                status, body = "200 OK", self.metrics().decode()
            else:
                status, body = "404 Not Found", "not found\n"
            data = body.encode()
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {CONTENT_TYPE}\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                + data
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
