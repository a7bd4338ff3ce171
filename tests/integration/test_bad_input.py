"""A catalogue of bad input sent to real services on 127.0.0.1 while a job runs.

Each request gets its documented answer (a JSON error naming what is wrong), and the
running job loses nothing: it keeps collecting and training, and its buffer never
shrinks in inserts.
"""

import os
import time
from pathlib import Path

import pytest
import requests

from common.config import deep_merge, load_config_file
from common.storage import SharedStore
from drover.local import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
# The example job, long enough to outlast the catalogue.
CONFIG = deep_merge(
    load_config_file(ROOT / "examples" / "cartpole_dqn.yaml"),
    {"env": {"stop_value": 10_000}, "system": {"max_env_step": 10_000_000}},
)


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("bad") / "run", num_collectors=2) as cluster:
        cluster.wait_for_workers()
        job_id = cluster.client.submit_job(CONFIG).job_id
        deadline = time.monotonic() + 60
        while cluster.client.job(job_id).train_iters < 50:
            assert time.monotonic() < deadline, "the job did not start training"
            time.sleep(0.2)
        yield cluster, job_id


def send(cluster, method, path, *, token=None, url=None, **kwargs):
    headers = kwargs.pop("headers", {})
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return requests.request(
        method, (url or cluster.coordinator_url) + path, headers=headers, timeout=10, **kwargs
    )


def test_bad_requests_get_their_answers_and_the_job_loses_nothing(running):
    cluster, job_id = running
    token = cluster.token
    store = SharedStore(cluster.shared_dir)
    before = cluster.client.buffer_stats(job_id)["inserts"]
    steps_before = cluster.client.job(job_id).env_steps

    a, b = (
        send(
            cluster,
            "POST",
            "/api/v1/workers",
            token=token,
            json={"role": "collector", "url": "http://127.0.0.1:9"},
        ).json()
        for _ in range(2)
    )
    outside = cluster.run_dir.parent / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "00000000.safetensors").write_bytes(b"secret")
    link_dir = store.resolve(f"{job_id}/segments") / "escape"
    os.symlink(outside, link_dir)
    garbage = store.segment_path(job_id, "operator", 0)
    store.write_bytes(garbage, b"\x20\x00\x00\x00\x00\x00\x00\x00not safetensors at all")
    deep: dict = {}
    node = deep
    for _ in range(50):
        node["a"] = {}
        node = node["a"]

    def insert(path, **extra):
        ref = {"path": path, "rows": 64, "env_steps": 64, "policy_version": 0}
        return {"json": {"segments": [ref], **extra}}

    sample = f"/api/v1/jobs/{job_id}/samples"
    cases = [
        # (what, method, path, token, kwargs, status, error code)
        ("no token", "GET", "/api/v1/jobs", None, {}, 401, "unauthorized"),
        ("wrong token", "GET", "/api/v1/jobs", "nope", {}, 401, "unauthorized"),
        (
            "wrong token, slave",
            "GET",
            "/v1/status",
            "nope",
            {"url": cluster.collectors[0].url},
            401,
            "unauthorized",
        ),
        (
            "another worker's credential",
            "POST",
            f"/api/v1/workers/{b['worker_id']}/heartbeat",
            a["credential"],
            {"json": {"tasks": []}},
            403,
            "forbidden",
        ),
        (
            "path traversal",
            "POST",
            f"/api/v1/jobs/{job_id}/segments",
            token,
            insert(f"{job_id}/segments/../../etc/passwd"),
            400,
            "invalid",
        ),
        (
            "absolute path",
            "POST",
            f"/api/v1/jobs/{job_id}/segments",
            token,
            insert("/etc/passwd"),
            400,
            "invalid",
        ),
        (
            "symlink out of the root",
            "POST",
            f"/api/v1/jobs/{job_id}/segments",
            token,
            insert(f"{job_id}/segments/escape/00000000.safetensors"),
            400,
            "invalid",
        ),
        (
            "oversized body",
            "POST",
            "/api/v1/jobs",
            token,
            {
                "data": b"{" + b" " * (9 * 1024 * 1024) + b"}",
                "headers": {"Content-Type": "application/json"},
            },
            413,
            "request_entity_too_large",
        ),
        ("negative number", "POST", sample, token, {"json": {"batch_size": -1}}, 400, "invalid"),
        ("huge number", "POST", sample, token, {"json": {"batch_size": 10**9}}, 400, "invalid"),
        (
            "huge wait",
            "POST",
            sample,
            token,
            {"json": {"batch_size": 8, "timeout_s": 10**6}},
            400,
            "invalid",
        ),
        ("wrong type", "POST", sample, token, {"json": {"batch_size": "64"}}, 400, "invalid"),
        ("deep nesting", "POST", "/api/v1/jobs", token, {"json": {"config": deep}}, 400, "invalid"),
        (
            "config out of range",
            "POST",
            "/api/v1/jobs",
            token,
            {"json": {"config": {"env": {"collector_env_num": 10**6}}}},
            400,
            "invalid",
        ),
        (
            "malformed JSON",
            "POST",
            "/api/v1/jobs",
            token,
            {"data": b"{nope", "headers": {"Content-Type": "application/json"}},
            400,
            "invalid",
        ),
        ("wrong method", "PUT", f"/api/v1/jobs/{job_id}", token, {}, 405, "method_not_allowed"),
        ("unknown job", "GET", "/api/v1/jobs/job-000000000000", token, {}, 404, "not_found"),
        (
            "unknown worker",
            "POST",
            "/api/v1/workers/collector-nobody/heartbeat",
            token,
            {"json": {"tasks": []}},
            404,
            "unknown_worker",
        ),
        (
            "unknown task",
            "POST",
            "/api/v1/tasks/collect-nothing/complete",
            token,
            {"json": {"result": {}}},
            404,
            "not_found",
        ),
    ]
    for what, method, path, auth, kwargs, status, code in cases:
        url = kwargs.pop("url", None)
        resp = send(cluster, method, path, token=auth, url=url, **kwargs)
        assert resp.status_code == status, (what, resp.status_code, resp.text[:300])
        body = resp.json()  # always JSON, never an HTML page
        assert body["error"] == code and body["message"], (what, body)

    # A corrupted segment is taken in (its file exists), then skipped by the learner
    # and reported with its path; the job goes on.
    resp = send(
        cluster,
        "POST",
        f"/api/v1/jobs/{job_id}/segments",
        token=token,
        **insert(garbage, timeout_s=8),  # waits for the rate limiter, as a collector would
    )
    assert resp.status_code == 200, resp.text
    deadline = time.monotonic() + 60
    while garbage not in cluster.client.metrics(job_id)["unusable_segments"]:
        assert time.monotonic() < deadline, "the corrupted segment was never reported"
        time.sleep(0.5)

    # Nothing was lost: the job runs on and keeps collecting.
    time.sleep(1.0)
    status = cluster.client.job(job_id)
    assert status.phase == "running"
    assert status.env_steps > steps_before
    assert cluster.client.buffer_stats(job_id)["inserts"] >= before
    assert not cluster.dead_services()
