"""The HTTP base every service's app shares: JSON errors, bearer auth (who may call
which route), and typed bodies, checked for size and shape before they are parsed.

Errors are `{"error": "<code>", "message": "<what to fix>"}` with a 4xx/5xx status;
never an HTML page, never a 500 for bad input.

The other two ends of HTTP are modules of their own: common/http_client.py calls a
service (`ServiceClient`, `ServiceUnavailable`), and common/http_server.py serves an
app (`serve`, `ServerLimits`).
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from flask import Flask, Response, current_app, g, jsonify, request
from prometheus_client import CollectorRegistry
from werkzeug.exceptions import HTTPException

from common.array_bodies import CONTENT_TYPE as ARRAYS_TYPE
from common.array_bodies import ArrayField
from common.array_bodies import decode as decode_arrays
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


def body(cls: type[T], arrays: dict[str, ArrayField] | None = None) -> T:
    """The request's JSON body validated into `cls` (400 naming the field otherwise);
    on a route that takes a binary body (`arrays`: which fields it carries as arrays),
    a frame (common/array_bodies.py) when its Content-Type says so.

    The body is held to `cls.body_limit`: one over its bytes is refused (413) from its
    Content-Length before any of it is read (one sent without, chunked, once it passes
    the limit), and one with more structure than the message holds is refused by
    `check_shape` before pydantic builds anything from it.
    """
    data = raw_body(cls, arrays)
    if arrays is not None and request.mimetype == ARRAYS_TYPE:
        return decode_arrays(cls, data, arrays)  # type: ignore[arg-type]
    limit: BodyLimit = cls.body_limit  # type: ignore[attr-defined]
    check_shape(data, limit, f"a {cls.__name__} body")
    return parse(cls, data)


def raw_body(cls: type[Any], arrays: dict[str, ArrayField] | None = None) -> bytes:
    """The request's body as it came, held to `cls.body_limit`'s bytes and its media
    type as `body` holds them (413, 415), unparsed: what a route that passes the
    request on sends."""
    limit: BodyLimit = cls.body_limit  # type: ignore[attr-defined]
    what = f"a {cls.__name__} body"
    size = request.content_length
    if size is not None and size > limit.max_bytes:
        raise ApiError(413, TOO_LARGE, f"{what} takes at most {limit.max_bytes} bytes, not {size}")
    framed = arrays is not None and request.mimetype == ARRAYS_TYPE
    if not (framed or request.is_json):
        also = f" or {ARRAYS_TYPE}" if arrays is not None else ""
        raise ApiError(415, "unsupported_media_type", f"send a JSON body (application/json){also}")
    # One sent without a Content-Length (chunked) is read up to one byte past the limit.
    request.max_content_length = limit.max_bytes + 1
    data = request.get_data()
    if len(data) > limit.max_bytes:
        raise ApiError(413, TOO_LARGE, f"{what} takes at most {limit.max_bytes} bytes")
    return data


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
