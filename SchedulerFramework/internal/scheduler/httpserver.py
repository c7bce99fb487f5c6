"""The scheduler's HTTP port (`--metrics-port`): Prometheus metrics and GET /debug/gangs.

Every path but /debug/gangs answers the metrics, as prometheus_client's own
server does (the Deployment's probes read /metrics). /debug/gangs answers
JSON: `{"gangs": [...]}`, one entry per gang a Coscheduling plugin knows
(`Coscheduling.debug_state`, with its profile): the plan, claimed nodes,
reserved and waiting members, the plan's deadline, a backoff.
"""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

from prometheus_client.exposition import MetricsHandler

from lj_runtimekit.schedulerframework.internal.plugins.coscheduling.plugin import Coscheduling
from lj_runtimekit.schedulerframework.internal.scheduler.scheduler import Scheduler

GANGS_PATH = "/debug/gangs"


def gangs(scheduler: Scheduler) -> list[dict[str, Any]]:
    """The state of every gang of every profile."""
    return [
        {"profile": name, **state}
        for name, fwk in scheduler.frameworks.items()
        for p in fwk.plugins
        if isinstance(p, Coscheduling)
        for state in p.debug_state()
    ]


def serve_http(port: int, scheduler: Scheduler, address: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serves metrics and /debug/gangs on `port` from a daemon thread; OSError when the port
    cannot be bound."""

    class Handler(MetricsHandler):
        def do_GET(self) -> None:
            if urlparse(self.path).path != GANGS_PATH:
                super().do_GET()
                return
            body = json.dumps({"gangs": gangs(scheduler)}, indent=1).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
