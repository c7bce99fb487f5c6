"""HTTP server of the Exporter: `/metrics` (gzip when the scraper accepts it) and `/healthz`.

`/metrics` negotiates the format like prometheus_client's own handler (its
`choose_encoder` and `gzip_accepted`): OpenMetrics for Prometheus, the 0.0.4
text format otherwise.

It runs in its own threads (a threading WSGI server), so scrapes are served
while the collection loop waits on the Runtime.
"""

from __future__ import annotations

import gzip
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.exposition import ThreadingWSGIServer, gzip_accepted

from lj_runtimekit.exporter.internal.metrics.registry import ExporterMetrics

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
HealthCheck = Callable[[], tuple[bool, str]]


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape."""

    def log_message(self, format: str, *args: Any) -> None:
        return


def make_app(metrics: ExporterMetrics, health: HealthCheck) -> WSGIApp:
    """The WSGI application: /metrics, /healthz, / (a pointer to both), 404 otherwise."""

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            started = time.perf_counter()
            body, content_type = metrics.render(environ.get("HTTP_ACCEPT", ""))
            headers = [("Content-Type", content_type)]
            if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
                # Level 1: a third of the size for a tenth of level 9's time.
                body = gzip.compress(body, compresslevel=1)
                headers.append(("Content-Encoding", "gzip"))
            headers.append(("Content-Length", str(len(body))))
            start_response("200 OK", headers)
            metrics.scrape_duration.observe(time.perf_counter() - started)
            return [body]
        if path == "/healthz":
            ok, detail = health()
            status = "200 OK" if ok else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [f"{detail}\n".encode()]
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"lj-exporter: metrics on /metrics, health on /healthz\n"]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [f"no such path {path}; try /metrics or /healthz\n".encode()]

    return app


class _ThreadingWSGIServer6(ThreadingWSGIServer):
    """The same server on an IPv6 address (e.g. `::` for every address)."""

    address_family = socket.AF_INET6


class MetricsServer:
    """The HTTP server on one address and port, served from a daemon thread."""

    def __init__(self, app: WSGIApp, address: str, port: int) -> None:
        server_class = _ThreadingWSGIServer6 if ":" in address else ThreadingWSGIServer
        # Raises OSError (address in use, permission) for the caller to report.
        self._server = make_server(address, port, app, server_class, handler_class=_QuietHandler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_port
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics-http", daemon=True
        )

    def start(self) -> None:
        """Serve in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
