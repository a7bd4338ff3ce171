"""Prometheus metrics every service shares: one registry per service instance (so
several apps in one test process never collide), the process's memory and CPU in
it, and the HTTP request counter and latency histogram that `install_http_basics`
hooks into every app.

Usage::

    registry = service_registry()                  # process_*, python_* included
    install_http_basics(app, token, service="collector", metrics=registry)
    steps = Counter("drover_env_steps", "Env steps", registry=registry)  # once, not per scrape
    GET /metrics  ->  metrics_response(registry)
"""

from __future__ import annotations

import threading
import time
import weakref

from flask import Flask, Response, g, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

#: Request latencies, up to the minute a long-poll may wait.
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Methods counted by name; any other is counted as "other" (bounded label values).
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
#: The route label of a request that matched no route (a 404 or 405).
UNMATCHED = "unmatched"


def service_registry() -> CollectorRegistry:
    """A registry of its own for one service instance, holding the process's memory,
    CPU, open files and start time (`process_*`), the Python version
    (`python_info`) and garbage collections (`python_gc_*`)."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def metrics_response(registry: CollectorRegistry) -> Response:
    """`registry` in the Prometheus text format."""
    return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)


_request_metrics: weakref.WeakKeyDictionary[CollectorRegistry, tuple[Counter, Histogram]] = (
    weakref.WeakKeyDictionary()
)
_request_metrics_lock = threading.Lock()


def request_metrics(registry: CollectorRegistry) -> tuple[Counter, Histogram]:
    """The request counter and latency histogram in `registry`, made on first use
    (two apps of one service instance count into the same ones)."""
    with _request_metrics_lock:
        found = _request_metrics.get(registry)
        if found is None:
            found = _request_metrics[registry] = (
                Counter(
                    "drover_http_requests",
                    "HTTP requests answered, by route, method and status code",
                    ["service", "route", "method", "status"],
                    registry=registry,
                ),
                Histogram(
                    "drover_http_request_duration_seconds",
                    "Time from a request's arrival in the app to its answer, by route",
                    ["service", "route", "method"],
                    buckets=LATENCY_BUCKETS_S,
                    registry=registry,
                ),
            )
        return found


def install_request_metrics(app: Flask, service: str, registry: CollectorRegistry) -> None:
    """Count `app`'s requests by route, method and status, and time them by route.

    The route is the URL rule (`/api/v1/jobs/<job_id>`), never the raw path, so a
    client cannot add label values. Its clock starts before every other
    `before_request` hook (authentication included), so refused requests count too.
    """
    requests_total, duration = request_metrics(registry)

    def _start_clock() -> None:
        g.drover_request_started_s = time.perf_counter()

    # First of all hooks: one that answers early (a 401) ends the hooks after it.
    app.before_request_funcs.setdefault(None, []).insert(0, _start_clock)

    @app.after_request
    def _count(response: Response) -> Response:
        rule = request.url_rule
        route = rule.rule if rule is not None else UNMATCHED
        method = request.method if request.method in HTTP_METHODS else "other"
        requests_total.labels(service, route, method, str(response.status_code)).inc()
        started = g.get("drover_request_started_s")
        if started is not None:
            duration.labels(service, route, method).observe(time.perf_counter() - started)
        return response
