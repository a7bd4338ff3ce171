"""Issue 23: a registration body within the server's 8 MiB, holding millions of empty
JSON objects, was parsed whole before it was refused; two of them took a coordinator
from about 100 MiB to over 1 GiB of RSS, and it stayed taken. Sent to a real
coordinator process now, both are refused and its RSS stays where it was."""

import time
from pathlib import Path

import pytest
import requests

from drover.local import LocalCluster

pytestmark = pytest.mark.processes

#: Growth allowed for the two requests, in MiB; measured here: under 0.1 (before the
#: body limits: about 1,000).
GROWTH_BOUND_MIB = 5
MAX_BODY_BYTES = 8 * 1024 * 1024


def rss_mib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def registration(resources: bytes = b"{}") -> bytes:
    return (
        b'{"role": "collector", "url": "http://127.0.0.1:1", "slave_token": "'
        + b"s" * 32
        + b'", "resources": '
        + resources
        + b"}"
    )


def amplifier() -> bytes:
    """A registration as large as the server takes, its resources millions of `{}`."""
    head, tail = registration(b'{"a": [').removesuffix(b"}"), b"]}}"
    count = (MAX_BODY_BYTES - len(head) - len(tail)) // 3
    return head + b",".join([b"{}"] * count) + tail


def test_an_amplifying_registration_costs_the_coordinator_nothing(tmp_path):
    with LocalCluster(tmp_path, num_collectors=0, num_learners=0) as cluster:
        pid = cluster.coordinator.process.pid
        url = f"{cluster.coordinator_url}/api/v1/workers"
        headers = {
            "Authorization": f"Bearer {cluster.registration_token}",
            "Content-Type": "application/json",
        }
        # Warm the route and its error answers first.
        assert requests.post(url, data=registration(), headers=headers, timeout=10).ok
        bad = requests.post(url, data=registration(b"[]"), headers=headers, timeout=10)
        assert bad.status_code == 400
        before = rss_mib(pid)
        body = amplifier()
        assert len(body) <= MAX_BODY_BYTES
        answers = []
        for _ in range(2):
            started = time.monotonic()
            resp = requests.post(url, data=body, headers=headers, timeout=120)
            answers.append((resp.status_code, resp.text[:200], time.monotonic() - started))
        after = rss_mib(pid)
        assert cluster.coordinator.alive()
    assert after - before < GROWTH_BOUND_MIB, f"RSS {before:.1f} -> {after:.1f} MiB"
    for status, text, took_s in answers:
        assert status == 413 and "request_entity_too_large" in text, text
        assert took_s < 10, f"refused after {took_s:.1f} s"
