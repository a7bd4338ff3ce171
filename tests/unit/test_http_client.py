"""`ServiceClient` against a raw socket server: a GET whose connection is reset is sent
once more on a fresh connection, a POST is not, and a read timeout is never repeated;
what goes out (JSON body, query) and how an error answer comes back."""

from __future__ import annotations

import http.client
import io
import json
import math
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from common.errors import ApiError
from common.http_client import ServiceClient, ServiceUnavailable

BODY = b'{"ok": true}'
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)


def read_request(conn: socket.socket) -> bytes:
    """One whole request as sent: its head, then the Content-Length of body (a client
    may send them in separate writes, so one recv can hold the head alone)."""
    with conn.makefile("rb") as stream:  # closed here, so close() on conn still resets
        lines = []
        while (line := stream.readline()) not in (b"\r\n", b"\n", b""):
            lines.append(line)
        headers = http.client.parse_headers(io.BytesIO(b"".join(lines[1:]) + b"\r\n"))
        body = stream.read(int(headers.get("Content-Length", 0)))
    return b"".join(lines) + b"\r\n" + body


class ResettingServer:
    """Accepts connections on 127.0.0.1; for each, reads one request and then, by
    `script` in order: "reset" (closes with an RST), "silent" (never answers, holds
    the connection open), "ok" (answers 200 with a JSON body) or the bytes of a whole
    answer to send."""

    def __init__(self, script: list[str | bytes]) -> None:
        self.script = list(script)
        self.requests: list[bytes] = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self._sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            conn.settimeout(5.0)
            self.requests.append(read_request(conn))
            what = self.script.pop(0) if self.script else "ok"
            if isinstance(what, bytes):
                conn.sendall(what)
                conn.close()
            elif what == "reset":
                # Linger 0: close() sends an RST, as a server dropping a connection does.
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
            elif what == "silent":
                self._held.append(conn)
            else:
                conn.sendall(OK)
                conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        for conn in self._held:
            conn.close()
        self._sock.close()


@pytest.fixture
def server_factory() -> Iterator:
    servers: list[ResettingServer] = []

    def make(script: list[str | bytes]) -> ResettingServer:
        servers.append(ResettingServer(script))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def test_a_get_whose_connection_is_reset_is_sent_once_more(server_factory) -> None:
    server = server_factory(["reset", "ok"])
    client = ServiceClient(server.url, "t", timeout_s=5.0)
    assert client.call("GET", "/api/v1/jobs/j") == {"ok": True}
    assert len(server.requests) == 2
    assert all(r.startswith(b"GET /api/v1/jobs/j ") for r in server.requests)


def test_a_get_reset_twice_fails_unavailable(server_factory) -> None:
    server = server_factory(["reset", "reset", "ok"])
    client = ServiceClient(server.url, "t", timeout_s=5.0)
    with pytest.raises(ServiceUnavailable):
        client.call("GET", "/api/v1/jobs/j")
    assert len(server.requests) == 2


def test_a_post_whose_connection_is_reset_is_not_sent_again(server_factory) -> None:
    server = server_factory(["reset", "ok"])
    client = ServiceClient(server.url, "t", timeout_s=5.0)
    with pytest.raises(ServiceUnavailable):
        client.call("POST", "/api/v1/jobs/j/insert", {"rows": 1})
    assert len(server.requests) == 1


def test_a_get_that_times_out_is_not_sent_again(server_factory) -> None:
    server = server_factory(["silent", "ok"])
    client = ServiceClient(server.url, "t", timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(ServiceUnavailable):
        client.call("GET", "/api/v1/jobs/j")
    assert time.monotonic() - started < 2.0
    assert len(server.requests) == 1


def answer(status: str, body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n%s\r\n%s" % (
        status.encode(),
        len(body),
        head.encode(),
        body,
    )


def test_a_payload_goes_as_json_and_params_as_the_query(server_factory) -> None:
    server = server_factory(["ok"])
    client = ServiceClient(server.url, "secret", timeout_s=5.0)
    got = client.call("POST", "/api/v1/x", {"rows": [1, 2]}, params={"a": "b c", "n": 3})
    assert got == {"ok": True}
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /api/v1/x?a=b+c&n=3 HTTP/1.1")
    assert b"Content-Type: application/json" in head
    assert b"Authorization: Bearer secret" in head
    assert json.loads(body) == {"rows": [1, 2]}


def test_an_empty_answer_is_none(server_factory) -> None:
    server = server_factory([answer("204 No Content", b"")])
    assert ServiceClient(server.url, "t", timeout_s=5.0).call("DELETE", "/x") is None


def test_an_error_answer_is_an_api_error_with_its_code_and_retry_after(server_factory) -> None:
    body = b'{"error": "rate_limited", "message": "wait", "retry_after_s": 0.25}'
    server = server_factory([answer("429 Too Many Requests", body)])
    with pytest.raises(ApiError) as caught:
        ServiceClient(server.url, "t", timeout_s=5.0).call("POST", "/x", {"a": 1})
    assert (caught.value.status, caught.value.code) == (429, "rate_limited")
    assert caught.value.message == "wait"
    assert caught.value.retry_after_s == 0.25


def test_an_error_not_in_json_keeps_its_text_and_retry_after_header(server_factory) -> None:
    server = server_factory(
        [answer("503 Service Unavailable", b"<html>down</html>", "Retry-After: 2")]
    )
    with pytest.raises(ApiError) as caught:
        ServiceClient(server.url, "t", timeout_s=5.0).call("GET", "/x")
    assert (caught.value.status, caught.value.code) == (503, "http_error")
    assert "down" in caught.value.message
    assert caught.value.retry_after_s == 2.0


def test_a_payload_that_is_not_json_is_refused_before_sending(server_factory) -> None:
    server = server_factory(["ok"])
    with pytest.raises(ValueError):
        ServiceClient(server.url, "t", timeout_s=5.0).call("POST", "/x", {"loss": math.nan})
    assert server.requests == []
