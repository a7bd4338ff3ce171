"""`drover.local.free_port`: the port a local service is told to bind lies outside the
range the kernel gives outgoing connections their ports from, so no connection made
between the pick and the bind can take it."""

from __future__ import annotations

import socket

from drover import local
from drover.local import ephemeral_ports, free_port


def test_a_free_port_is_below_the_ephemeral_range_and_bindable():
    low, high = ephemeral_ports()
    assert 1024 <= low <= high
    ports = {free_port() for _ in range(20)}
    assert all(1024 <= port < low for port in ports)
    assert len(ports) > 1  # picked at random, not the same one each time
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_taken_is_not_picked(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        # Every pick lands on the taken port first, then on the next one.
        picks = iter([busy, busy, busy + 1])
        monkeypatch.setattr(local.random, "randrange", lambda first, stop: next(picks))
        monkeypatch.setattr(local, "ephemeral_ports", lambda: (busy + 200, busy + 300))
        assert free_port() == busy + 1


def test_without_room_below_the_range_the_kernel_picks(monkeypatch):
    monkeypatch.setattr(local, "ephemeral_ports", lambda: (1024, 65535))
    port = free_port()
    assert 1024 <= port <= 65535
