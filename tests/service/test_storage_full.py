"""A job whose writes find the shared volume full (its tasks say so in heartbeats):
the coordinator shows it (status, metric), lets it wait while it waits with progress
or for less than `system.storage_grace_s`, and fails it past that."""

import pytest
from prometheus_client import generate_latest

from common.storage import SharedStore
from common.storage_full import ROOM_WAIT_KEY
from services.coordinator.app import create_app
from services.coordinator.core import CoordinatorLimits
from services.coordinator.settings import CoordinatorSettings
from tests.buffer_hosts import make_coordinator
from tests.coordinator_app import CONFIG, TOKEN, get, register, submit

GRACE_S = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def cluster(tmp_path):
    clock = Clock()
    core = make_coordinator(
        SharedStore(tmp_path),
        CoordinatorLimits(max_buffer_items=1000, lease_timeout_s=10.0),
        clock=clock,
    )
    app = create_app(CoordinatorSettings(shared_dir=tmp_path, token=TOKEN), core=core)
    client = app.test_client()
    config = {**CONFIG, "system": {"storage_grace_s": GRACE_S}}
    job_id = submit(client, config)
    collector = register(client, "collector", "http://127.0.0.1:8101").json
    tasks = {d.worker_id: d.task for d in core.plan() if d.task is not None}
    task = tasks[collector["worker_id"]]
    core.dispatched(task.task_id)

    def beat(**progress):
        resp = client.post(
            f"/api/v1/workers/{collector['worker_id']}/heartbeat",
            json={"tasks": [{"task_id": task.task_id, "state": "running", "progress": progress}]},
            headers={"Authorization": f"Bearer {collector['credential']}"},
        )
        assert resp.status_code == 200, resp.json

    yield core, client, clock, job_id, beat
    core.close()


def status(client, job_id):
    return get(client, f"/api/v1/jobs/{job_id}").json


def test_a_job_waiting_for_room_is_shown_and_fails_only_past_its_grace(cluster):
    core, client, clock, job_id, beat = cluster
    beat(**{ROOM_WAIT_KEY: 5.0})
    core.plan()
    assert status(client, job_id)["storage_full_s"] == 5.0
    scrape = generate_latest(core.metrics.registry).decode()
    assert f'drover_job_storage_full_seconds{{job_id="{job_id}"}} 5.0' in scrape
    for _ in range(10):  # 50 s more, still said at each heartbeat
        clock.now += 5.0
        beat(**{ROOM_WAIT_KEY: 5.0})
        core.plan()
    shown = status(client, job_id)
    assert shown["phase"] == "running" and shown["storage_full_s"] == 55.0
    clock.now += 5.0
    beat(**{ROOM_WAIT_KEY: 5.0})
    core.plan()
    shown = status(client, job_id)
    assert shown["phase"] == "failed", shown
    assert "no room" in shown["reason"] and "storage_grace_s" in shown["reason"]


def test_progress_or_silence_ends_the_wait(cluster):
    core, client, clock, job_id, beat = cluster
    beat(**{ROOM_WAIT_KEY: 50.0})
    core.plan()
    assert status(client, job_id)["storage_full_s"] == 50.0
    core.jobs[job_id].env_steps += 10  # an insert landed: progress
    clock.now += 5.0
    beat(**{ROOM_WAIT_KEY: 55.0})
    core.plan()
    assert status(client, job_id)["storage_full_s"] == 0.0  # waiting again, from now
    clock.now += 30.0
    beat(env_steps_per_s=100.0)  # no task speaks of a wait for a lease's time: over
    core.plan()
    shown = status(client, job_id)
    assert shown["storage_full_s"] is None and shown["phase"] == "running"
