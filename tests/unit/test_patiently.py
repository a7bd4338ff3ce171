"""Workers wait out a restarting coordinator for the calls a task cannot lose."""

import threading

import pytest

from common.errors import ApiError
from common.http_client import ServiceUnavailable
from services.slave.core import patiently


def flaky(failures):
    calls = []

    def call(value):
        calls.append(value)
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]
        return value * 2

    return call, calls


def test_transient_errors_are_waited_out():
    call, calls = flaky([ServiceUnavailable("down"), ApiError(503, "shutting_down", "x")])
    assert patiently(threading.Event(), call, 21) == 42
    assert calls == [21, 21, 21]


def test_a_refusal_is_not_retried():
    call, calls = flaky([ApiError(409, "task_not_active", "gone")])
    with pytest.raises(ApiError):
        patiently(threading.Event(), call, 1)
    assert calls == [1]


def test_a_stopped_task_stops_waiting():
    stop = threading.Event()
    stop.set()
    call, calls = flaky([ServiceUnavailable("down")] * 100)
    with pytest.raises(ServiceUnavailable):
        patiently(stop, call, 1)
    assert len(calls) == 1
