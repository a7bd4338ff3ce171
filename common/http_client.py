"""How drover calls a drover service: `ServiceClient`, JSON over HTTP (urllib3) with a
timeout on every call, a refused connection tried again, and a GET whose kept-alive
connection the server reset sent once more; `ServiceUnavailable` when a service cannot
be reached; `is_transient` and `retry_wait_s`, which answers are worth trying again and
how long to wait first (for tenacity).

Usage::

    client = ServiceClient("http://127.0.0.1:8000", token, timeout_s=10.0)
    status = client.call_as(JobStatus, "GET", f"/api/v1/jobs/{job_id}")  # ApiError: 4xx, 5xx
"""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any, TypeVar
from urllib.parse import urlencode

import urllib3
from tenacity import RetryCallState, wait_random_exponential
from urllib3.exceptions import HTTPError, ReadTimeoutError
from urllib3.util.retry import Retry

from common.errors import ApiError
from common.messages import dump, dump_json, parse

#: The prefix of every service's public routes (the coordinator's, a buffer process's).
API = "/api/v1"

T = TypeVar("T")


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
    for every method. A GET whose pooled connection was reset (a server closes
    connections idle past its channel timeout, and one may close just as a request goes
    out on it) is sent once more: a GET changes nothing. No other request that may have
    reached the server is repeated here, and no read timeout is (a long poll would wait
    twice as long): callers retry only the calls that are idempotent.

    It speaks urllib3 directly, not through `requests`, whose sessions, hooks and header
    merging cost more CPU than the rest of a call (bench/service_client.py: a small GET
    took 1,262 us of the caller's CPU through requests, 489 us now), and a collector
    inserts and a learner's feeder samples some hundred times a second.
    """

    def __init__(
        self, base_url: str, token: str, *, timeout_s: float = 10.0, connect_retries: int = 3
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._token = token
        #: Once set (a worker's own credential), used instead of the cluster token.
        self.credential: str | None = None
        self._retry = _ResetGetRetry(
            total=connect_retries + 1,
            connect=connect_retries,
            read=1,
            status=0,
            other=0,
            allowed_methods=frozenset({"GET"}),
            backoff_factor=0.1,
            backoff_jitter=0.1,
            raise_on_status=False,
        )
        # One pool per thread, so that no thread waits for another's connection.
        self._local = threading.local()

    def renew(self, credential: str) -> None:
        """Send this credential from now on (a worker's task credential, renewed)."""
        self.credential = credential

    @property
    def bearer(self) -> str:
        """The secret this client sends: its own credential once set, else the token
        (handed to a process that calls the same service as this one)."""
        return self.credential or self._token

    @property
    def _pool(self) -> urllib3.PoolManager:
        pool = getattr(self._local, "pool", None)
        if pool is None:
            pool = urllib3.PoolManager(retries=self._retry)
            self._local.pool = pool
        return pool

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
        if not resp.data:
            return None
        return json.loads(resp.data)

    def call_as(
        self,
        cls: type[T],
        method: str,
        path: str,
        payload: Any = None,
        *,
        timeout_s: float | None = None,
        params: dict[str, Any] | None = None,
        auth: str | None = None,
    ) -> T:
        """One request whose answer is validated straight from its bytes into `cls`."""
        resp = self.raw(method, path, payload, timeout_s=timeout_s, params=params, auth=auth)
        return parse(cls, resp.data)

    def raw(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        timeout_s: float | None = None,
        params: dict[str, Any] | None = None,
        auth: str | None = None,
        content_type: str = "application/json",
        accept: str | None = None,
    ) -> urllib3.BaseHTTPResponse:
        """One request; returns the answer with its body read (`.data`).

        `payload`: a message or plain data, sent as JSON, or bytes, sent as they are
        with `content_type`. `accept`: the media type asked for in the answer."""
        headers = {"Authorization": f"Bearer {auth or self.bearer}"}
        if accept is not None:
            headers["Accept"] = accept
        body = None
        if isinstance(payload, bytes):
            body = payload
        elif dataclasses.is_dataclass(payload) and not isinstance(payload, type):
            # A message is serialized by pydantic's compiled encoder: `dump` + json's
            # encoder cost a learner's feeder a fifth of its interpreter time, on the
            # priorities every sample request carries.
            body = dump_json(payload)
        elif payload is not None:
            body = json.dumps(dump(payload), allow_nan=False).encode()
        if body is not None:
            headers["Content-Type"] = content_type
        url = self.base_url + path
        if params:
            url += "?" + urlencode(params)
        timeout_s = timeout_s if timeout_s is not None else self.timeout_s
        try:
            resp = self._pool.request(
                method,
                url,
                body=body,
                headers=headers,
                timeout=urllib3.Timeout(connect=timeout_s, read=timeout_s),
                redirect=False,
            )
        except HTTPError as exc:
            raise ServiceUnavailable(f"{method} {url}: {exc}") from exc
        if resp.status >= 400:
            raise _error_from(resp)
        return resp

    def close(self) -> None:
        pool = getattr(self._local, "pool", None)
        if pool is not None:
            pool.clear()


class _ResetGetRetry(Retry):
    """urllib3's Retry, less read timeouts: its `read` budget then goes only to
    connections reset or closed before an answer came (urllib3's ProtocolError)."""

    def increment(self, method=None, url=None, response=None, error=None, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        if isinstance(error, ReadTimeoutError):
            raise error
        return super().increment(method, url, response, error, *args, **kwargs)


def _error_from(resp: urllib3.BaseHTTPResponse) -> ApiError:
    try:
        data = json.loads(resp.data)
        code, message = str(data["error"]), str(data["message"])
        retry_after = data.get("retry_after_s")
    except (ValueError, KeyError, TypeError):
        text = resp.data.decode("utf-8", errors="replace")
        code, message, retry_after = "http_error", text[:200], None
    if retry_after is None and "Retry-After" in resp.headers:
        try:
            retry_after = float(resp.headers["Retry-After"])
        except ValueError:
            retry_after = None
    return ApiError(resp.status, code, message, retry_after_s=retry_after)
