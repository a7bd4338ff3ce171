"""A catalogue of bad input sent to real services on 127.0.0.1 while a job runs.

Each request gets its documented answer (a JSON error naming what is wrong), and the
running job loses nothing: it keeps collecting and training, and its buffer never
shrinks in inserts.
"""

import concurrent.futures
import contextlib
import http.server
import os
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests
from safetensors.numpy import load as safetensors_load

from common.config import deep_merge
from common.storage import SharedStore
from drover.local import LocalCluster
from jobconfig import load_config_file
from tests.helpers import assert_alive, descendants, wait_until

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
# The example job, long enough to outlast the catalogue.
CONFIG = deep_merge(
    load_config_file(ROOT / "examples" / "cartpole_dqn.yaml"),
    {"env": {"stop_value": 10_000}, "system": {"max_env_step": 10_000_000}},
)


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    with LocalCluster(
        tmp_path_factory.mktemp("bad") / "run",
        num_collectors=2,
        # Short enough for the catalogue to watch idle connections being closed.
        extra_env={"DROVER_CHANNEL_TIMEOUT_S": "3"},
    ) as cluster:
        cluster.wait_for_workers()
        job_id = cluster.client.submit_job(CONFIG).job_id
        wait_until(lambda: cluster.client.job(job_id).train_iters >= 50, 60, "training")
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
            json={"role": "collector", "url": "http://127.0.0.1:9", "slave_token": "s" * 32},
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
        (
            "a file that is no segment",
            "POST",
            f"/api/v1/jobs/{job_id}/segments",
            token,
            insert(garbage),
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

    # Nothing was lost: the job runs on and keeps collecting.
    wait_until(lambda: cluster.client.job(job_id).env_steps > steps_before, 30, "more env steps")
    assert cluster.client.job(job_id).phase == "running"
    assert cluster.client.buffer_stats(job_id)["inserts"] >= before
    assert not cluster.dead_services()


# --- the attack catalogue: each finding, through the real services -------------------------


def columns(rows=64, **override):
    """A DQN segment's columns for CartPole (obs width 4, 2 actions)."""
    cols = {
        "obs": np.zeros((rows, 4), np.float32),
        "action": np.zeros(rows, np.int64),
        "reward": np.ones(rows, np.float32),
        "next_obs": np.zeros((rows, 4), np.float32),
        "done": np.zeros(rows, np.float32),
        "discount": np.full(rows, 0.99, np.float32),
    }
    return {**cols, **override}


def operator_insert(cluster, job_id, path, rows=64, **ref):
    body = {"path": path, "rows": rows, "env_steps": rows, "policy_version": 0, **ref}
    return send(
        cluster,
        "POST",
        f"/api/v1/jobs/{job_id}/segments",
        token=cluster.token,
        json={"segments": [body], "timeout_s": 8},
    )


class Recorder(http.server.BaseHTTPRequestHandler):
    """A "worker" at a URL of an attacker's choice: it records what it is sent."""

    seen: list[str] = []

    def do_POST(self):  # noqa: N802 - the handler's name is http.server's
        Recorder.seen.append(self.headers.get("Authorization", ""))
        self.send_response(503)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_worker_credential_never_leads_to_the_cluster_token(running):
    cluster, job_id = running
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        own_secret = "a" * 40
        reg = {"role": "collector", "url": url, "slave_token": own_secret}
        worker = send(cluster, "POST", "/api/v1/workers", token=cluster.token, json=reg).json()
        credential = worker["credential"]
        # With a worker's credential nobody registers further "workers" ...
        forged = send(cluster, "POST", "/api/v1/workers", token=credential, json=reg)
        assert forged.status_code == 403 and forged.json()["error"] == "forbidden"
        # ... nor does anything an operator does.
        for method, path, body in [
            ("GET", "/api/v1/jobs", None),
            ("GET", "/api/v1/workers", None),
            ("POST", "/api/v1/jobs", {"config": CONFIG}),
            ("DELETE", f"/api/v1/jobs/{job_id}", None),
            ("GET", f"/api/v1/jobs/{job_id}/policy", None),
            ("GET", f"/api/v1/jobs/{job_id}/metrics", None),
            ("GET", f"/api/v1/jobs/{job_id}/buffer", None),
            ("POST", f"/api/v1/jobs/{job_id}/samples", {"batch_size": 8, "timeout_s": 0}),
            ("POST", f"/api/v1/jobs/{job_id}/priorities", {"keys": [1], "priorities": [9.0]}),
            ("GET", "/metrics", None),
        ]:
            resp = send(cluster, method, path, token=credential, json=body)
            assert resp.status_code == 403, (method, path, resp.text[:200])
        # The scheduler calls the URL with the secret the worker gave, never the token.
        wait_until(lambda: Recorder.seen, 20, "the scheduler to call the worker")
        assert set(Recorder.seen) == {f"Bearer {own_secret}"}
        # Advertised URLs are checked before anything is sent to them.
        for bad in ("http://169.254.169.254", "file:///etc/passwd", "http://u:p@127.0.0.1:1"):
            resp = send(
                cluster, "POST", "/api/v1/workers", token=cluster.token, json={**reg, "url": bad}
            )
            assert resp.status_code == 400 and resp.json()["message"].startswith("url"), bad
    finally:
        server.shutdown()
        server.server_close()


def test_env_ids_from_a_request_never_run_code(running):
    cluster, _ = running
    marker = cluster.run_dir.parent / "planted-ran"
    # Planted where the services run (their working directory is the shared root).
    (cluster.shared_dir / "planted_env.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\nclass Env: pass\n"
    )
    bad_envs = [
        ({"env_id": "planted_env:Env"}, "config.env.env_id"),
        ({"env_id": "this:CartPole-v1"}, "config.env.env_id"),
        ({"env_id": "os:system"}, "config.env.env_id"),
        ({"env_id": "no_such_module_xyz:Env-v0"}, "config.env.env_id"),
        ({"env_id": "a:b:c"}, "config.env.env_id"),
        ({"env_id": "phys2d/CartPole-v1"}, "config.env.env_id"),  # needs jax
        ({"env_id": "CartPole-v7"}, "config.env.env_id"),
        ({"env_kwargs": {"max_episode_steps": 0}}, "config.env.env_kwargs"),
        ({"env_kwargs": {"render_mode": 5}}, "config.env.env_kwargs"),
        ({"env_kwargs": {"render_mode": "human"}}, "config.env.env_kwargs"),
        ({"env_kwargs": {"entry_point": "os:system"}}, "config.env.env_kwargs"),
    ]
    for env, field in bad_envs:
        config = deep_merge(CONFIG, {"env": env})
        started = time.monotonic()
        resp = send(cluster, "POST", "/api/v1/jobs", token=cluster.token, json={"config": config})
        assert resp.status_code == 400, (env, resp.status_code, resp.text[:300])
        assert resp.json()["message"].startswith(field), (env, resp.json())
        assert time.monotonic() - started < 5, env
    assert not marker.exists(), "a module named by a request was imported"


def test_declared_sizes_are_checked_against_the_file(running):
    cluster, job_id = running
    store = SharedStore(cluster.shared_dir)
    path = store.segment_path(job_id, "sizes", 0)
    store.write_segment(path, columns(64))
    raw = f"/api/v1/jobs/{job_id}/segments"
    for ref, field in [
        ({"rows": 16_384}, "segments.0.rows"),  # a 64-row file declared large
        ({"rows": 10**12}, "segments.0.rows"),
        ({"policy_version": 2**31}, "segments.0.policy_version"),
        ({"env_steps": 10**400}, "segments.0.env_steps"),
        ({"episode_returns": [1e308]}, "segments.0.episode_returns.0"),
    ]:
        body = {"path": path, "rows": 64, "env_steps": 64, "policy_version": 0, **ref}
        resp = send(cluster, "POST", raw, token=cluster.token, json={"segments": [body]})
        assert resp.status_code == 400, (ref, resp.text[:300])
        assert resp.json()["message"].startswith(field), (ref, resp.json())
    nan = (
        b'{"segments": [{"path": "%s", "rows": 64, "env_steps": 64, "policy_version": 0, '
        b'"episode_returns": [NaN]}]}' % path.encode()
    )
    resp = send(
        cluster,
        "POST",
        raw,
        token=cluster.token,
        data=nan,
        headers={"Content-Type": "application/json"},
    )
    assert resp.status_code == 400
    # Metrics still render for every job.
    assert send(cluster, "GET", "/metrics", token=cluster.token).status_code == 200


def test_poisoned_segments_are_skipped_and_listed_never_trained_on(running):
    cluster, job_id = running
    store = SharedStore(cluster.shared_dir)
    poisoned = {
        "nan reward": columns(reward=np.full(64, np.nan, np.float32)),
        "inf obs": columns(obs=np.full((64, 4), np.inf, np.float32)),
        "wrong width": columns(obs=np.zeros((64, 7), np.float32)),
        "action out of range": columns(action=np.full(64, 5, np.int64)),
        "negative action": columns(action=np.full(64, -1, np.int64)),
        "float actions": columns(action=np.zeros(64, np.float32)),
    }
    paths = {}
    for seq, (what, cols) in enumerate(poisoned.items()):
        paths[what] = store.segment_path(job_id, "poison", seq)
        store.write_segment(paths[what], cols)
        assert operator_insert(cluster, job_id, paths[what]).status_code == 200, what
    # The next two files are swapped after their insert. The learner reads a segment
    # as soon as a sample names it and caches what it read, so it is held stopped
    # meanwhile, its feeder process with it (which samples and reads on its own):
    # otherwise it may read (and keep) the file before the swap. The collectors are
    # stopped first, and the learner samples on until the rate limiter holds it: the
    # limiter then has room for these small inserts.
    for collector in cluster.collectors:
        collector.signal(signal.SIGSTOP)
    learning = [
        pid
        for learner in cluster.learners
        for pid in (learner.process.pid, *descendants(learner.process.pid))
    ]
    try:
        wait_until(
            lambda: cluster.client.buffer_stats(job_id)["waiting_samplers"] > 0,
            30,
            "the rate limiter to hold the learner's samples",
        )
        for pid in learning:
            os.kill(pid, signal.SIGSTOP)
        # A file that is swapped for a FIFO after its insert must not block the learner.
        fifo = store.segment_path(job_id, "poison", len(poisoned))
        store.write_segment(fifo, columns(16))
        assert operator_insert(cluster, job_id, fifo, rows=16).status_code == 200
        store.resolve(fifo).unlink()
        os.mkfifo(store.resolve(fifo))
        # A huge sparse file with a valid header is refused by size, not read whole.
        sparse = store.segment_path(job_id, "poison", len(poisoned) + 1)
        store.write_segment(sparse, columns(16))
        assert operator_insert(cluster, job_id, sparse, rows=16).status_code == 200
        with open(store.resolve(sparse), "r+b") as f:
            f.truncate(1 << 40)
    finally:
        for pid in learning:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        for service in cluster.collectors:
            service.signal(signal.SIGCONT)
    paths.update(fifo=fifo, sparse=sparse)

    def unlisted():
        listed = set(cluster.client.metrics(job_id)["unusable_segments"])
        return [what for what, path in paths.items() if path not in listed]

    wait_until(
        lambda: not unlisted(),
        90,
        lambda: f"each to be reported unusable; never were: {unlisted()}",
    )
    status = cluster.client.job(job_id)
    assert status.phase == "running", status.reason
    # Training went on, and what it publishes is finite.
    before = status.train_iters
    wait_until(lambda: cluster.client.job(job_id).train_iters > before, 30, "more training")
    weights = safetensors_load(cluster.client.policy_bytes(job_id))
    assert all(np.isfinite(w).all() for w in weights.values())


def train_iters_while(cluster, job_id, done, *, timeout_s, what):
    """Poll the job's train_iters until `done()`; returns the longest time they stood
    still meanwhile."""
    deadline = time.monotonic() + timeout_s
    last, since, longest = cluster.client.job(job_id).train_iters, time.monotonic(), 0.0
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
        now, iters = time.monotonic(), cluster.client.job(job_id).train_iters
        if iters != last:
            last, since = iters, now
        longest = max(longest, now - since)
    return longest


def test_a_segment_swapped_for_a_fifo_costs_its_own_rows_only(running):
    """Issue 23: a segment replaced by a FIFO after its insert was acknowledged, between
    two good ones. It is skipped and listed; the good ones around it are not; training
    never pauses for it, nor after the FIFO's writer gives it an end of file."""
    cluster, job_id = running
    store = SharedStore(cluster.shared_dir)
    before, fifo, after = (store.segment_path(job_id, "fifo-attack", i) for i in range(3))
    store.write_segment(before, columns())
    assert operator_insert(cluster, job_id, before).status_code == 200
    store.write_segment(fifo, columns())
    assert operator_insert(cluster, job_id, fifo).status_code == 200
    store.resolve(fifo).unlink()
    os.mkfifo(store.resolve(fifo))
    store.write_segment(after, columns())
    assert operator_insert(cluster, job_id, after).status_code == 200
    started = cluster.client.job(job_id).train_iters

    def listed_and_trained_past_it():
        unusable = cluster.client.metrics(job_id)["unusable_segments"]
        return fifo in unusable and cluster.client.job(job_id).train_iters > started + 50

    # Without a bound on its read, training stood still for as long as the read did.
    paused_s = train_iters_while(
        cluster, job_id, listed_and_trained_past_it, timeout_s=30, what="the FIFO held training"
    )
    assert paused_s < 10, f"training paused {paused_s:.1f} s"
    # Its writer opens it and closes it (an end of file): nothing changes.
    os.close(os.open(store.resolve(fifo), os.O_RDWR | os.O_NONBLOCK))
    now = cluster.client.job(job_id).train_iters
    paused_s = train_iters_while(
        cluster,
        job_id,
        lambda: cluster.client.job(job_id).train_iters > now + 50,
        timeout_s=30,
        what="training did not go on after the end of file",
    )
    assert paused_s < 10, f"training paused {paused_s:.1f} s"
    unusable = set(cluster.client.metrics(job_id)["unusable_segments"])
    assert fifo in unusable and not {before, after} & unusable
    assert cluster.client.job(job_id).phase == "running"


def test_special_files_in_segment_folders_never_stop_the_orphan_sweep(running, tmp_path):
    """A link out of the root (a file or a folder) and a FIFO among the segment folders:
    the coordinator's periodic sweep passes them by and still deletes an unreadable
    file it finds after them."""
    cluster, job_id = running
    store = SharedStore(cluster.shared_dir)
    segments = store.resolve(f"{job_id}/segments")
    target = tmp_path / "outside.safetensors"
    store.write_segment(f"{job_id}/segments/w/00000000.safetensors", columns())
    target.write_bytes(store.read_bytes(f"{job_id}/segments/w/00000000.safetensors"))
    store.delete(f"{job_id}/segments/w/00000000.safetensors")
    (segments / "a-links").mkdir()
    os.symlink(target, segments / "a-links" / "00000000.safetensors")
    os.symlink(tmp_path, segments / "b-out-of-root")
    fifo = store.segment_path(job_id, "c-fifo", 0)
    store.resolve(fifo).parent.mkdir()
    os.mkfifo(store.resolve(fifo))
    # Never inserted, and too old to be one a collector is about to insert.
    garbage = store.segment_path(job_id, "zz-orphans", 0)
    store.write_bytes(garbage, b"\x20\x00\x00\x00\x00\x00\x00\x00not safetensors at all")
    old = time.time() - 3600
    for path in (fifo, garbage):
        os.utime(store.resolve(path), (old, old))
    wait_until(  # sweeps run every 10 s
        lambda: not (store.exists(garbage) or store.exists(fifo)),
        40,
        "the sweep to delete the FIFO and the orphan after the special files",
    )
    assert target.read_bytes()  # what a link leads to is never touched
    assert cluster.client.job(job_id).phase == "running"


def test_bad_numbers_in_messages_are_refused_not_500(running):
    cluster, job_id = running
    reg = {"role": "learner", "url": "http://127.0.0.1:9", "slave_token": "b" * 32}
    worker = send(cluster, "POST", "/api/v1/workers", token=cluster.token, json=reg).json()
    as_worker = worker["credential"]
    json_body = {"Content-Type": "application/json"}
    cases = [
        (
            "NaN progress",
            f"/api/v1/workers/{worker['worker_id']}/heartbeat",
            as_worker,
            b'{"tasks": [{"task_id": "t", "state": "running", "progress": {"loss": NaN}}]}',
        ),
        (
            "huge progress",
            f"/api/v1/workers/{worker['worker_id']}/heartbeat",
            as_worker,
            b'{"tasks": [{"task_id": "t", "state": "running", "progress": {"x": 1e400}}]}',
        ),
        (
            "priority 1e300",
            f"/api/v1/jobs/{job_id}/priorities",
            cluster.token,
            b'{"keys": [1], "priorities": [1e300]}',
        ),
        (
            "huge priority key",
            f"/api/v1/jobs/{job_id}/priorities",
            cluster.token,
            b'{"keys": [100000000000000000000000], "priorities": [1.0]}',
        ),
        (
            "NaN priority",
            f"/api/v1/jobs/{job_id}/priorities",
            cluster.token,
            b'{"keys": [1], "priorities": [NaN]}',
        ),
        (
            "sample too large",
            f"/api/v1/jobs/{job_id}/samples",
            cluster.token,
            b'{"batch_size": 8192, "num_batches": 256, "timeout_s": 0}',
        ),
        (
            "eval result NaN",
            "/api/v1/tasks/evaluate-nothing/complete",
            cluster.token,
            b'{"result": {"policy_version": 1, "returns": [NaN], "lengths": [1]}}',
        ),
    ]
    for what, path, token, data in cases:
        resp = send(cluster, "POST", path, token=token, data=data, headers=dict(json_body))
        assert 400 <= resp.status_code < 500, (what, resp.status_code, resp.text[:300])
        assert resp.json()["error"], what
    for version in ("99999999999", "1" * 5000, "1e3"):
        resp = send(
            cluster, "GET", f"/api/v1/jobs/{job_id}/policy?version={version}", token=cluster.token
        )
        assert resp.status_code == 400, version
    big = {**reg, "resources": {f"k{i}": "x" * 200 for i in range(5000)}}
    resp = send(cluster, "POST", "/api/v1/workers", token=cluster.token, json=big)
    assert resp.status_code == 413  # a registration is a few KiB at most
    resp = send(cluster, "GET", "/api//v1/jobs", token=cluster.token, allow_redirects=False)
    assert resp.status_code == 404 and resp.headers["Content-Type"] == "application/json"


def test_slow_and_half_open_clients_cannot_block_the_server(running):
    cluster, job_id = running
    port = int(cluster.coordinator_url.rsplit(":", 1)[1])
    socks = []
    try:
        # 200 clients that start a request and never finish it (slowloris).
        for _ in range(200):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Le")
            socks.append(sock)
        started = time.monotonic()
        assert cluster.client.job(job_id).phase == "running"
        assert time.monotonic() - started < 3, "a normal client waited behind them"
        # An unauthenticated client announcing a huge body is refused from its header,
        # before any of the body is read.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as big:
            big.sendall(
                b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1073741824\r\n\r\n{"
            )
            answer = b""
            while chunk := big.recv(65536):  # the server closes after answering
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 413"), answer[:100]
        assert b'"error": "request_entity_too_large"' in answer
        # The half-open connections are closed once idle past the channel timeout.
        socks[0].settimeout(20)
        assert socks[0].recv(1024) == b"", "a half-sent request was kept open"
    finally:
        for sock in socks:
            sock.close()


def test_one_jobs_long_polls_cannot_starve_another_jobs_learner(running):
    cluster, job_id = running
    # Its buffer cannot be sampled for long, whether or not the collectors are shared
    # with it meanwhile.
    empty = {"replay_buffer": {"min_size_to_sample": 200_000, "replay_buffer_size": 200_000}}
    starved = deep_merge(CONFIG, {"exp_name": "starved", "policy": {"other": empty}})
    other = cluster.client.submit_job(starved).job_id
    try:
        before = cluster.client.job(job_id).train_iters

        def poll(_):
            return send(
                cluster,
                "POST",
                f"/api/v1/jobs/{other}/samples",
                token=cluster.token,
                json={"batch_size": 8, "timeout_s": 4},
            ).json()["error"]

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(poll, range(16)))
            during = cluster.client.job(job_id).train_iters
        # The other job's empty buffer holds 4 requests; the rest are told at once.
        assert codes.count("too_many_waiting") == 12 and codes.count("sample_timeout") == 4
        assert during > before
    finally:
        cluster.client.stop_job(other)


def test_workers_that_never_answer_do_not_hold_up_assignments(running):
    cluster, job_id = running
    holes = []
    for _ in range(12):
        hole = socket.socket()
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)  # connections complete in the kernel; nobody ever answers
        holes.append(hole)
    try:
        evals_before = len(cluster.client.metrics(job_id)["evals"])
        ids = set()
        for hole in holes:
            reg = {
                "role": "collector",
                "url": f"http://127.0.0.1:{hole.getsockname()[1]}",
                "slave_token": "h" * 32,
            }
            resp = send(cluster, "POST", "/api/v1/workers", token=cluster.token, json=reg)
            ids.add(resp.json()["worker_id"])
        wait_until(
            lambda: not ids & {w.worker_id for w in cluster.client.workers()},
            90,
            "the workers that never answer to be dropped",
        )
        # The live job goes on evaluating.
        wait_until(
            lambda: len(cluster.client.metrics(job_id)["evals"]) > evals_before,
            60,
            "another evaluation",
        )
    finally:
        for hole in holes:
            hole.close()


def test_the_job_trained_and_evaluated_throughout(running):
    """Whatever ran before it (or nothing: it passes alone), the job trains on and is
    evaluated, and no service died."""
    cluster, job_id = running
    wait_until(
        lambda: (
            cluster.client.job(job_id).train_iters > 500
            and len(cluster.client.metrics(job_id)["evals"]) >= 2
        ),
        120,
        lambda: (
            f"500 train iterations and 2 evaluations; at {cluster.client.job(job_id)}, "
            f"{len(cluster.client.metrics(job_id)['evals'])} evaluations"
        ),
    )
    assert cluster.client.job(job_id).phase == "running"
    assert_alive(cluster)
