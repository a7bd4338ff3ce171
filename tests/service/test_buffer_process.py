"""A buffer process's app (services/buffer/app.py) through Flask's test client: a
task's credential lets that task, and only it, insert or sample; an ended task's is
refused; the coordinator reads what to count; the buffer's snapshot survives a new
process."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from common.config import ReplayBufferConfig
from common.storage import SharedStore
from services.buffer.app import create_app
from services.buffer.credentials import TaskGrant, TaskGrants, credential_key, sign, verify
from services.buffer.host import ShardHost, ShardLimits
from tests.coordinator_app import write_segment

TOKEN = "cluster-token"
JOB = "job-abc123"
KEY = credential_key(TOKEN)


def credential(task_id, worker_id, kind="collect", job_id=JOB):
    return sign(KEY, TaskGrant(job_id, task_id, worker_id, kind))


def bearer(secret):
    return {"Authorization": f"Bearer {secret}"}


def open_host(root):
    config = ReplayBufferConfig(type="uniform", replay_buffer_size=1000, min_size_to_sample=10)
    return ShardHost.open(
        SharedStore(root),
        JOB,
        config,
        error_buffer=100.0,
        seed=0,
        grants=TaskGrants(KEY, JOB),
        limits=ShardLimits(),
    )


@pytest.fixture
def shard(tmp_path):
    host = open_host(tmp_path)
    client = create_app(host, TOKEN).test_client()
    yield host, client, SimpleNamespace(store=host.store)
    host.stop()


def test_a_credential_names_one_task_of_one_job():
    grant = TaskGrant(JOB, "collect-1", "collector-1", "collect")
    signed = sign(KEY, grant)
    assert verify(KEY, signed) == grant
    assert verify(credential_key("another token"), signed) is None
    other = sign(KEY, TaskGrant(JOB, "collect-1", "collector-2", "collect"))
    forged = other.rpartition(".")[0] + "." + signed.rpartition(".")[2]  # this signature
    assert verify(KEY, forged) is None
    assert verify(KEY, "bt1.a.b") is None
    with pytest.raises(ValueError):
        sign(KEY, TaskGrant(JOB, "a.b", "collector-1", "collect"))


def test_a_collector_inserts_into_its_own_folder_with_its_tasks_credential(shard):
    host, client, core = shard
    own = bearer(credential("collect-1", "collector-1"))
    ref = write_segment(core, JOB, 0, worker="collector-1.collect-1")
    insert = {"segments": [ref], "task_id": "collect-1"}
    resp = client.post(f"/api/v1/jobs/{JOB}/segments", json=insert, headers=own)
    assert resp.status_code == 200 and resp.json["accepted"] == 1, resp.json
    assert resp.json["env_steps"] == 10
    # Another task's id, another job, another folder, a forged credential: refused.
    other = {**insert, "task_id": "collect-2"}
    assert client.post(f"/api/v1/jobs/{JOB}/segments", json=other, headers=own).status_code == 409
    elsewhere = write_segment(core, JOB, 1, worker="collector-9.collect-9")
    resp = client.post(
        f"/api/v1/jobs/{JOB}/segments",
        json={"segments": [elsewhere], "task_id": "collect-1"},
        headers=own,
    )
    assert resp.status_code == 403 and "own folder" in resp.json["message"]
    stranger = bearer(credential("collect-1", "collector-1", job_id="job-other"))
    assert (
        client.post(f"/api/v1/jobs/{JOB}/segments", json=insert, headers=stranger).status_code
        == 401
    )
    # A learner's credential may not insert; a collector's may not sample.
    learner = bearer(credential("learn-1", "learner-1", "learn"))
    assert (
        client.post(f"/api/v1/jobs/{JOB}/segments", json=insert, headers=learner).status_code == 403
    )
    sample = {"batch_size": 4, "timeout_s": 0, "task_id": "collect-1"}
    assert client.post(f"/api/v1/jobs/{JOB}/samples", json=sample, headers=own).status_code == 403
    # The coordinator's own routes: the cluster token only.
    assert client.get("/v1/shard/report", headers=own).status_code == 403
    report = client.get("/v1/shard/report", headers=bearer(TOKEN)).json
    assert report["env_steps"] == 10 and report["size"] == 10


def test_an_ended_tasks_credential_is_refused_and_its_held_items_go_back(tmp_path):
    root = tmp_path
    config = ReplayBufferConfig(
        type="fifo", replay_buffer_size=1000, min_size_to_sample=10, max_staleness=None
    )
    host = ShardHost.open(
        SharedStore(root),
        JOB,
        config,
        error_buffer=100.0,
        seed=0,
        grants=TaskGrants(KEY, JOB),
        limits=ShardLimits(),
    )
    client = create_app(host, TOKEN).test_client()
    core = SimpleNamespace(store=host.store)
    collector = bearer(credential("collect-1", "collector-1"))
    for seq in range(2):
        ref = write_segment(core, JOB, seq, worker="collector-1.collect-1")
        client.post(
            f"/api/v1/jobs/{JOB}/segments",
            json={"segments": [ref], "task_id": "collect-1"},
            headers=collector,
        )
    learner = bearer(credential("learn-1", "learner-1", "learn"))
    got = client.post(
        f"/api/v1/jobs/{JOB}/samples",
        json={"batch_size": 8, "timeout_s": 0, "task_id": "learn-1"},
        headers=learner,
    )
    assert got.status_code == 200 and got.json["hold_id"]
    assert host.buffer.size == 12
    ends = client.post("/v1/shard/task-ends", json={"task_ids": ["learn-1"]}, headers=bearer(TOKEN))
    assert ends.status_code == 200
    assert host.buffer.size == 20  # the held items are back
    again = client.post(
        f"/api/v1/jobs/{JOB}/samples",
        json={"batch_size": 8, "timeout_s": 0, "task_id": "learn-1"},
        headers=learner,
    )
    assert again.status_code == 401
    host.stop()


def test_reports_carry_the_returns_counted_since_the_last(shard):
    host, client, core = shard
    own = bearer(credential("collect-1", "collector-1"))
    for seq in range(3):
        ref = {
            **write_segment(core, JOB, seq, worker="collector-1.collect-1"),
            "episode_returns": [float(seq)],
            "episode_lengths": [5],
        }
        client.post(
            f"/api/v1/jobs/{JOB}/segments",
            json={"segments": [ref], "task_id": "collect-1"},
            headers=own,
        )
    first = client.get("/v1/shard/report?since=0", headers=bearer(TOKEN)).json
    assert first["episode_returns"] == [0.0, 1.0, 2.0] and first["returns_seq"] == 3
    later = client.get(f"/v1/shard/report?since={first['returns_seq']}", headers=bearer(TOKEN))
    assert later.json["episode_returns"] == [] and later.json["env_steps"] == 30
    assert client.get("/v1/shard/report?since=x", headers=bearer(TOKEN)).status_code == 400


def test_a_new_process_restores_the_snapshot_and_indexes_files_written_since(tmp_path):
    host = open_host(tmp_path)
    core = SimpleNamespace(store=host.store)
    client = create_app(host, TOKEN).test_client()
    own = bearer(credential("collect-1", "collector-1"))
    for seq in range(2):
        ref = write_segment(core, JOB, seq, worker="collector-1.collect-1")
        client.post(
            f"/api/v1/jobs/{JOB}/segments",
            json={"segments": [ref], "task_id": "collect-1"},
            headers=own,
        )
    host.snapshot()
    # Acknowledged after the snapshot, then the process is killed: the file is on disk,
    # its reference in its header.
    ref = write_segment(core, JOB, 2, worker="collector-1.collect-1", header=True)
    client.post(
        f"/api/v1/jobs/{JOB}/segments",
        json={"segments": [ref], "task_id": "collect-1"},
        headers=own,
    )
    host.stop()
    again = open_host(tmp_path)
    assert again.restore() == 1
    assert again.buffer.size == 30 and again.report().env_steps == 30
    again.stop()


def test_a_restore_indexes_every_readable_file_and_leaves_a_young_unreadable_one(tmp_path):
    """A new job's process restores too: a file its writer has not inserted yet must not
    be deleted for a header it cannot read, while an old unusable one goes."""
    store = SharedStore(tmp_path)
    young = store.segment_path(JOB, "w", 0)
    old = store.segment_path(JOB, "w", 1)
    for path in (young, old):
        store.write_bytes(path, b"\x20\x00\x00\x00\x00\x00\x00\x00not safetensors")
    hour_ago = time.time() - 3600
    os.utime(store.resolve(old), (hour_ago, hour_ago))
    core = SimpleNamespace(store=store)
    readable = write_segment(core, JOB, 2, worker="collector-1.collect-1", header=True)
    host = open_host(tmp_path)
    try:
        assert host.restore() == 1 and host.buffer.size == readable["rows"]
        assert store.exists(young) and not store.exists(old)
    finally:
        host.stop()


def test_the_end_closes_the_buffer_and_releases_its_files(shard):
    host, client, core = shard
    own = bearer(credential("collect-1", "collector-1"))
    ref = write_segment(core, JOB, 0, worker="collector-1.collect-1")
    client.post(
        f"/api/v1/jobs/{JOB}/segments",
        json={"segments": [ref], "task_id": "collect-1"},
        headers=own,
    )
    host.snapshot()
    final = client.post("/v1/shard/close", headers=bearer(TOKEN))
    assert final.status_code == 200 and final.json["size"] == 10
    resp = client.post(
        f"/api/v1/jobs/{JOB}/segments",
        json={"segments": [ref], "task_id": "collect-1"},
        headers=own,
    )
    assert resp.status_code == 409 and resp.json["error"] == "job_finished"
    assert client.post("/v1/shard/release", headers=bearer(TOKEN)).status_code == 200
    # The last snapshot at SIGTERM comes after the release: it writes nothing (a delta
    # would name the cut the release removed).
    assert host.snapshot() is None
    host.stop()  # the deletes queued are done
    assert not host.store.exists(ref["path"])
    assert not host.store.exists(f"{JOB}/buffer-0/state.json")


def test_credentials_end_without_a_list_expired_or_older_than_their_process(tmp_path, monkeypatch):
    """A restarted buffer process (or a restarted coordinator's new one) takes only
    credentials signed since it started: an ended task's are refused with no list of
    ended tasks replayed to it, and a live task's are answered 503 (retried) until its
    next heartbeat renews them; one older than the TTL is refused the same way."""
    before = credential("collect-1", "collector-1")
    started = time.time() + 2  # the process starts after the credential was signed
    grants = TaskGrants(KEY, JOB, ttl_s=60.0, started_s=started)
    host = ShardHost.open(
        SharedStore(tmp_path),
        JOB,
        ReplayBufferConfig(type="uniform", replay_buffer_size=1000, min_size_to_sample=10),
        error_buffer=100.0,
        seed=0,
        grants=grants,
        limits=ShardLimits(),
    )
    try:
        client = create_app(host, TOKEN).test_client()
        ref = write_segment(
            SimpleNamespace(store=host.store), JOB, 0, worker="collector-1.collect-1"
        )
        body = {"segments": [ref], "task_id": "collect-1"}
        refused = client.post(f"/api/v1/jobs/{JOB}/segments", json=body, headers=bearer(before))
        assert refused.status_code == 503 and refused.json["error"] == "credential_stale"
        assert refused.headers["Retry-After"]
        # Its next heartbeat's credential, signed after the process started.
        monkeypatch.setattr("itsdangerous.timed.time.time", lambda: started + 1)
        renewed = credential("collect-1", "collector-1")
        assert (
            client.post(
                f"/api/v1/jobs/{JOB}/segments", json=body, headers=bearer(renewed)
            ).status_code
            == 200
        )
        # Past its TTL, without a renewal (its worker's heartbeats stopped).
        monkeypatch.setattr("itsdangerous.timed.time.time", lambda: started + 100)
        expired = client.post(f"/api/v1/jobs/{JOB}/segments", json=body, headers=bearer(renewed))
        assert expired.status_code == 503 and "120" not in expired.json["message"]
        assert "issued more than 60 s ago" in expired.json["message"]
    finally:
        host.stop()


def test_a_learn_credential_of_an_older_lease_is_refused_once_a_newer_one_is_seen(shard):
    """Fencing at the data plane: the learner of a lease that was taken over cannot
    sample or send priorities with its credential, still signed and unexpired."""
    host, client, _ = shard
    old = bearer(sign(KEY, TaskGrant(JOB, "learn-1", "learner-1", "learn", epoch=1)))
    new = bearer(sign(KEY, TaskGrant(JOB, "learn-2", "learner-2", "learn", epoch=2)))
    ask = {"batch_size": 8, "timeout_s": 0}
    url = f"/api/v1/jobs/{JOB}/samples"
    assert client.post(url, json=ask | {"task_id": "learn-1"}, headers=old).status_code != 401
    assert client.post(url, json=ask | {"task_id": "learn-2"}, headers=new).status_code != 401
    assert client.post(url, json=ask | {"task_id": "learn-1"}, headers=old).status_code == 401
