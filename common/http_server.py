"""How a service's app is served: waitress, a production WSGI server, within
`ServerLimits`, its own error answers (a body over the limit, a malformed request) as
JSON like every other answer, until SIGTERM or SIGINT (`serve`).

Usage (a service's `__main__`)::

    serve(app, settings.host, settings.port, limits=settings.server_limits(), on_stop=stop)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
from collections.abc import Callable
from typing import Any

from flask import Flask
from waitress.channel import HTTPChannel
from waitress.server import create_server as waitress_server
from waitress.task import ErrorTask

from common.http import MAX_BODY_BYTES

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerLimits:
    """How much one server lets its clients hold (waitress's own limits).

    A client that opens many connections and sends a request slowly (slowloris) holds
    a connection, not a thread: waitress reads requests on its event loop and hands
    only complete ones to the worker threads. So the defence is many cheap
    connections and a deadline on idle ones, not a few threads.
    """

    threads: int = 16
    #: Open connections at once; past it, new ones wait in the listen backlog.
    connection_limit: int = 1000
    #: A connection with no complete request for this long is closed (a half-sent
    #: request included); long-polls are complete requests and are not cut.
    channel_timeout_s: float = 30.0
    #: How often idle connections are looked for.
    cleanup_interval_s: float = 5.0
    #: Bodies over this are refused from their Content-Length, before any is read.
    max_body_bytes: int = MAX_BODY_BYTES
    max_header_bytes: int = 64 * 1024


def serve(
    app: Flask,
    host: str,
    port: int,
    *,
    limits: ServerLimits | None = None,
    on_stop: Callable[[], None],
    on_listening: Callable[[], None] | None = None,
) -> None:
    """Serve `app` with waitress (a production WSGI server) until SIGTERM or SIGINT.

    `on_listening` runs once the socket accepts connections (a slave registers then,
    so the coordinator never calls it before it can answer). On either signal
    `on_stop` runs first (the service stops its work and says goodbye to the
    coordinator), then the serving loop ends and this returns.
    """
    server = create_server(app, host, port, limits or ServerLimits())

    def _stop(signum: int, _frame: Any) -> None:
        # Runs in the main thread, inside waitress's loop: leaving by an exception is
        # the one way to end that loop while clients hold keep-alive connections.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        log.info("signal %d: stopping", signum)
        on_stop()
        raise _Stopped

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    log.info("serving %s on http://%s:%d", app.name, host, port)
    if on_listening is not None:
        on_listening()
    try:
        server.run()
    except _Stopped:
        pass
    finally:
        server.close()
    log.info("stopped")


def create_server(app: Flask, host: str, port: int, limits: ServerLimits) -> Any:
    """A waitress server for `app` with `limits`, whose own error answers (a body over
    the limit, a malformed request line) are JSON like every other answer."""
    server = waitress_server(
        app,
        host=host,
        port=port,
        threads=limits.threads,
        connection_limit=limits.connection_limit,
        channel_timeout=limits.channel_timeout_s,
        cleanup_interval=limits.cleanup_interval_s,
        max_request_body_size=limits.max_body_bytes,
        max_request_header_size=limits.max_header_bytes,
        ident="drover",
    )
    server.channel_class = _JsonErrorChannel
    return server


class _JsonErrorTask(ErrorTask):
    """waitress's own error answers (413, 400 for a malformed request), as JSON."""

    def execute(self) -> None:
        error = self.request.error
        code = error.reason.lower().replace(" ", "_")
        data = json.dumps({"error": code, "message": str(error.body)}).encode()
        self.status = f"{error.code} {error.reason}"
        self.response_headers.append(("Content-Type", "application/json"))
        self.set_close_on_finish()
        self.content_length = len(data)
        self.write(data)


class _JsonErrorChannel(HTTPChannel):
    error_task_class = _JsonErrorTask


class _Stopped(Exception):
    """Raised by the signal handler to leave the serving loop."""
