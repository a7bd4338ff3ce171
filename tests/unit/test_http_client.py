"""`ServiceClient` against a raw socket server that resets the first connection it is
given: a GET is sent once more on a fresh connection, a POST is not, and a read
timeout is never repeated."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from common.http_client import ServiceClient, ServiceUnavailable

BODY = b'{"ok": true}'
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)


class ResettingServer:
    """Accepts connections on 127.0.0.1; for each, reads one request and then, by
    `script` in order: "reset" (closes with an RST), "silent" (never answers, holds
    the connection open) or "ok" (answers 200 with a JSON body)."""

    def __init__(self, script: list[str]) -> None:
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
            request = conn.recv(65536)
            self.requests.append(request)
            what = self.script.pop(0) if self.script else "ok"
            if what == "reset":
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

    def make(script: list[str]) -> ResettingServer:
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
