"""The HTTP base every service shares: JSON errors, bearer auth, typed bodies, a
typed client with timeouts, and a real WSGI server.

Errors are `{"error": "<code>", "message": "<what to fix>"}` with a 4xx/5xx status;
never an HTML page, never a 500 for bad input.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import signal
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import requests
from flask import Flask, Response, current_app, g, jsonify, request
from prometheus_client import CollectorRegistry
from requests.adapters import HTTPAdapter
from tenacity import RetryCallState, wait_random_exponential
from urllib3.util.retry import Retry
from waitress.channel import HTTPChannel
from waitress.server import create_server as waitress_server
from waitress.task import ErrorTask
from werkzeug.exceptions import HTTPException

from common.errors import ApiError, bad_request
from common.messages import BodyLimit, MessageError, dump, dump_json, parse
from common.metrics import install_request_metrics
from common.storage import PathError

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger(__name__)

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json"})
#: Any request's body; each route holds its body to less (`body_limit` of its message).
MAX_BODY_BYTES = 8 * 1024 * 1024
#: The error code of a body refused for its size: the one waitress and Flask use.
TOO_LARGE = "request_entity_too_large"


def error_response(err: ApiError) -> Response:
    body: dict[str, Any] = {"error": err.code, "message": err.message}
    if err.retry_after_s is not None:
        body["retry_after_s"] = round(err.retry_after_s, 3)
    resp = jsonify(body)
    resp.status_code = err.status
    if err.retry_after_s is not None:
        # The header takes whole seconds; the body carries the precise wait.
        resp.headers["Retry-After"] = str(max(1, round(err.retry_after_s)))
    return resp


@dataclasses.dataclass(frozen=True)
class Caller:
    """Who sent a request.

    An operator holds the cluster token (users, `drover` commands); a registrar holds
    the registration secret and may only register; a worker holds its own credential
    and may do only its role's work, for its own tasks.
    """

    kind: str  # "operator" | "registrar" | "scraper" | "worker"
    worker_id: str | None = None
    role: str | None = None  # a worker's role: "collector" | "learner"

    @property
    def name(self) -> str:
        """The role a route's `allow` list names: the worker's role, or the kind."""
        return self.role if self.kind == "worker" and self.role else self.kind


OPERATOR = Caller("operator")
REGISTRAR = Caller("registrar")
#: Holds the metrics secret: may read `/metrics` (routes marked `@allow("scraper")`).
SCRAPER = Caller("scraper")


def allow(*roles: str) -> Callable[[F], F]:
    """Let callers other than operators use a route: `@allow("collector", "learner")`.

    Routes are operator-only unless they say otherwise (deny by default). Place it
    under the route decorator, so the registered view carries the mark.
    """

    def mark(view: F) -> F:
        view.__drover_allow__ = frozenset(roles)  # type: ignore[attr-defined]
        return view

    return mark


def public(view: F) -> F:
    """Let anyone use a route, with no token, like `/healthz`: only for routes that
    hold no data (the coordinator's dashboard page and its static files). Place it
    under the route decorator."""
    view.__drover_public__ = True  # type: ignore[attr-defined]
    return view


def install_http_basics(
    app: Flask,
    tokens: str | list[str],
    *,
    registration_token: str | None = None,
    worker_credential: Callable[[str], Caller | None] | None = None,
    metrics_token: str | None = None,
    service: str = "",
    metrics: CollectorRegistry | None = None,
) -> None:
    """JSON error handlers, a body-size limit, bearer-token auth with roles, and
    (given `metrics`) request counts and latencies for `app`.

    Args:
        tokens: the operator tokens (the cluster token; on a slave also the secret it
            gave the coordinator at registration).
        registration_token: a secret that may only register workers (optional).
        worker_credential: maps a worker's own credential to its `Caller` (the
            coordinator); such callers are then held to their role's routes.
        metrics_token: a secret that may only read `/metrics` (a Prometheus server's).
        service: the `service` label of the request metrics.
        metrics: the service's registry (common/metrics.py): every request is counted
            there by route, method and status (`drover_http_requests_total`) and timed
            (`drover_http_request_duration_seconds`).
    """
    if metrics is not None:
        install_request_metrics(app, service, metrics)
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    # `/api//v1/jobs` is a wrong path (404 JSON), not a redirect to an HTML page.
    app.url_map.merge_slashes = False
    operator_tokens = [t.encode() for t in ([tokens] if isinstance(tokens, str) else tokens) if t]
    registrar_token = registration_token.encode() if registration_token else None
    scraper_token = metrics_token.encode() if metrics_token else None

    def identify(header: str) -> Caller | None:
        scheme, _, given = header.partition(" ")
        if scheme != "Bearer" or not given:
            return None
        raw = given.encode()
        # Constant-time comparisons: no timing hint about how much of a token matched.
        if any(hmac.compare_digest(raw, t) for t in operator_tokens):
            return OPERATOR
        if registrar_token is not None and hmac.compare_digest(raw, registrar_token):
            return REGISTRAR
        if scraper_token is not None and hmac.compare_digest(raw, scraper_token):
            return SCRAPER
        return worker_credential(given) if worker_credential is not None else None

    @app.before_request
    def _authenticate() -> Response | None:
        g.caller = None
        if request.path in PUBLIC_PATHS:
            return None
        if getattr(app.view_functions.get(request.endpoint or ""), "__drover_public__", False):
            return None
        who = identify(request.headers.get("Authorization", ""))
        if who is None:
            return error_response(
                ApiError(401, "unauthorized", "send 'Authorization: Bearer <DROVER_TOKEN>'")
            )
        g.caller = who
        if who.kind == "operator":
            return None
        view = app.view_functions.get(request.endpoint or "")
        if view is None:
            return None  # no such route: Flask answers 404 or 405
        if who.name not in getattr(view, "__drover_allow__", frozenset()):
            return error_response(
                ApiError(
                    403,
                    "forbidden",
                    f"a {who.name} credential may not {request.method} {request.path}",
                )
            )
        return None

    @app.errorhandler(ApiError)
    def _api_error(err: ApiError) -> Response:
        return error_response(err)

    @app.errorhandler(MessageError)
    def _message_error(err: MessageError) -> Response:
        return error_response(bad_request(err.field, err.message))

    @app.errorhandler(PathError)
    def _path_error(err: PathError) -> Response:
        return error_response(ApiError(400, "invalid_path", str(err)))

    @app.errorhandler(HTTPException)
    def _http_error(err: HTTPException) -> Response:
        code = (err.name or "error").lower().replace(" ", "_")
        return error_response(ApiError(err.code or 500, code, err.description or err.name))

    @app.errorhandler(Exception)
    def _unexpected(err: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(ApiError(500, "internal", f"{type(err).__name__}: {err}"))


def body(cls: type[T]) -> T:
    """The request's JSON body validated into `cls` (400 naming the field otherwise).

    The body is held to `cls.body_limit`: one over its bytes is refused (413) from its
    Content-Length before any of it is read (one sent without, chunked, once it passes
    the limit), and one with more structure than the message holds is refused by
    `check_shape` before pydantic builds anything from it.
    """
    limit: BodyLimit = cls.body_limit  # type: ignore[attr-defined]
    what = f"a {cls.__name__} body"
    size = request.content_length
    if size is not None and size > limit.max_bytes:
        raise ApiError(413, TOO_LARGE, f"{what} takes at most {limit.max_bytes} bytes, not {size}")
    if not request.is_json:
        raise ApiError(415, "unsupported_media_type", "send a JSON body (application/json)")
    # One sent without a Content-Length (chunked) is read up to one byte past the limit.
    request.max_content_length = limit.max_bytes + 1
    data = request.get_data()
    if len(data) > limit.max_bytes:
        raise ApiError(413, TOO_LARGE, f"{what} takes at most {limit.max_bytes} bytes")
    check_shape(data, limit, what)
    return parse(cls, data)


_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{},:')


def check_shape(data: bytes, limit: BodyLimit, what: str = "the body") -> None:
    """Refuse JSON `data` with more arrays and objects, values, keys or nesting than
    `limit` allows, from its bytes alone: a few passes in C over them, no object built.

    Raises:
        ApiError: 413 for too many arrays and objects, values or keys; 400 for too deep.
    """
    shape = structure(data)
    containers = shape.count(b"{") + shape.count(b"[")
    if containers > limit.max_containers:
        raise ApiError(
            413,
            TOO_LARGE,
            f"{what} holds at most {limit.max_containers} arrays and objects, not {containers}",
        )
    values = shape.count(b",")
    if values > limit.max_values:
        raise ApiError(
            413, TOO_LARGE, f"{what} holds at most {limit.max_values} values, not {values}"
        )
    keys = shape.count(b":")
    if keys > limit.max_keys:
        raise ApiError(413, TOO_LARGE, f"{what} holds at most {limit.max_keys} keys, not {keys}")
    if containers > limit.max_depth and nesting(shape, limit.max_depth) > limit.max_depth:
        raise bad_request("body", f"{what} nests arrays and objects at most {limit.max_depth} deep")


def structure(data: bytes) -> bytes:
    """The quotes, brackets, commas and colons of JSON `data`, in order, but for
    escaped quotes (those inside strings count: upper bounds of the arrays, objects,
    values and keys)."""
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    return data.translate(None, _NOT_STRUCTURE)


def nesting(shape: bytes, most: int) -> int:
    """How deep arrays and objects nest in JSON whose `structure` is `shape`, counted
    up to `most` + 1.

    The strings (between quotes), commas and colons are dropped, then each round
    takes away the innermost pairs of brackets. Answers `most` + 1 for what cannot be JSON:
    unbalanced brackets, or more strings than values.
    """
    quotes = shape.count(b'"')
    # Each string is a key or a value, and has a comma, colon or bracket for every two.
    if quotes % 2 or quotes > 4 * (len(shape) - quotes) + 2:
        return most + 1
    brackets = b"".join(shape.split(b'"')[::2]).translate(None, b",:")
    depth = 0
    while brackets and depth <= most:
        # Both kinds of innermost pair at once: "0" keeps `{[]}` from going in one round.
        brackets = brackets.replace(b"[]", b"0").replace(b"{}", b"0").translate(None, b"0")
        depth += 1
    return depth if not brackets else most + 1


def reply(message: Any, status: int = 200) -> tuple[Response, int]:
    if dataclasses.is_dataclass(message):
        return Response(dump_json(message), mimetype="application/json"), status
    return jsonify(dump(message)), status


def caller() -> str | None:
    """The worker making this request (by its own credential); None for an operator
    holding the cluster token."""
    who = g.get("caller")
    return who.worker_id if who is not None else None


def extension(name: str) -> Any:
    """An object the app factory put in `app.extensions` (the service's core)."""
    return current_app.extensions[name]


# --- client ----------------------------------------------------------------------


class ServiceUnavailable(Exception):
    """The service could not be reached (connection refused, timeout)."""


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: unreachable, restarting (502-504), or rate limited (429)."""
    if isinstance(exc, ServiceUnavailable):
        return True
    return isinstance(exc, ApiError) and exc.status in (429, 502, 503, 504)


def retry_wait_s(state: RetryCallState) -> float:
    """tenacity wait: the server's Retry-After when it gave one, else exponential
    backoff with full jitter (0.1 s doubling, at most 5 s)."""
    exc = state.outcome.exception() if state.outcome is not None else None
    if isinstance(exc, ApiError) and exc.retry_after_s:
        return exc.retry_after_s
    return _JITTERED(state)


_JITTERED = wait_random_exponential(multiplier=0.1, max=5.0)


class ServiceClient:
    """JSON over HTTP to one drover service, with a timeout on every call.

    Connection failures are retried a few times with exponential backoff and jitter
    (urllib3's Retry): a refused connection never reached the server, so this is safe
    for every method. A request that did reach it is not repeated here: callers retry
    only the calls that are idempotent.
    """

    def __init__(
        self, base_url: str, token: str, *, timeout_s: float = 10.0, connect_retries: int = 3
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._token = token
        #: Once set (a worker's own credential), used instead of the cluster token.
        self.credential: str | None = None
        self._retry = Retry(
            total=connect_retries,
            connect=connect_retries,
            read=0,
            status=0,
            other=0,
            backoff_factor=0.1,
            backoff_jitter=0.1,
            raise_on_status=False,
        )
        # requests.Session is not documented as thread-safe: one per thread.
        self._local = threading.local()

    @property
    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            adapter = HTTPAdapter(max_retries=self._retry)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
            self._local.session = session
        return session

    def call(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        timeout_s: float | None = None,
        params: dict[str, Any] | None = None,
        auth: str | None = None,
    ) -> Any:
        """One request; returns the decoded JSON answer (None for an empty body).

        Raises:
            ApiError: the service answered with an error status.
            ServiceUnavailable: it could not be reached in time.
        """
        resp = self.raw(method, path, payload, timeout_s=timeout_s, params=params, auth=auth)
        if not resp.content:
            return None
        return resp.json()

    def call_as(
        self,
        cls: type[T],
        method: str,
        path: str,
        payload: Any = None,
        *,
        timeout_s: float | None = None,
        auth: str | None = None,
    ) -> T:
        """One request whose answer is validated straight from its bytes into `cls`."""
        resp = self.raw(method, path, payload, timeout_s=timeout_s, auth=auth)
        return parse(cls, resp.content)

    def raw(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        timeout_s: float | None = None,
        params: dict[str, Any] | None = None,
        auth: str | None = None,
    ) -> requests.Response:
        try:
            resp = self._session.request(
                method,
                self.base_url + path,
                json=dump(payload) if payload is not None else None,
                headers={"Authorization": f"Bearer {auth or self.credential or self._token}"},
                params=params,
                timeout=timeout_s if timeout_s is not None else self.timeout_s,
            )
        except requests.RequestException as exc:
            raise ServiceUnavailable(f"{method} {self.base_url}{path}: {exc}") from exc
        if resp.status_code >= 400:
            raise _error_from(resp)
        return resp

    def close(self) -> None:
        session = getattr(self._local, "session", None)
        if session is not None:
            session.close()


def _error_from(resp: requests.Response) -> ApiError:
    try:
        data = resp.json()
        code, message = str(data["error"]), str(data["message"])
        retry_after = data.get("retry_after_s")
    except (ValueError, KeyError, TypeError):
        code, message, retry_after = "http_error", resp.text[:200], None
    if retry_after is None and "Retry-After" in resp.headers:
        try:
            retry_after = float(resp.headers["Retry-After"])
        except ValueError:
            retry_after = None
    return ApiError(resp.status_code, code, message, retry_after_s=retry_after)


# --- serving ---------------------------------------------------------------------


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
