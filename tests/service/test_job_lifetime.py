"""What the coordinator keeps of ended jobs and tasks: a small durable record, no index,
no task objects; ended jobs listed in pages and forgotten after their retention."""

import threading
import time

import pytest
from prometheus_client import generate_latest

from common.errors import ApiError
from common.messages import JobSubmit, WorkerRegistration
from common.storage import SharedStore
from services.coordinator.app import create_app
from services.coordinator.core import CoordinatorLimits
from services.coordinator.settings import CoordinatorSettings
from services.coordinator.snapshot import read_job_record
from tests.buffer_hosts import make_coordinator
from tests.coordinator_app import (
    AUTH,
    CONFIG,
    TOKEN,
    get,
    insert_segments,
    post,
    register,
    submit,
)
from tests.helpers import wait_until


class WallClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def restarted(tmp_path, **limits):
    again = make_coordinator(
        SharedStore(tmp_path), CoordinatorLimits(max_buffer_items=1000, **limits)
    )
    again.restore_jobs()
    return again


def answers(core, job_id):
    """What users read of a job: its status, its buffer, its metrics."""
    return core.job_status(job_id), core.buffer_stats(job_id), core.job_metrics(job_id)


def test_an_ended_job_lets_go_of_its_index_and_answers_the_same_after_a_restart(
    tmp_path,
    client,
    core,
):
    job_id = submit(client)
    insert_segments(client, core, job_id, 4)
    learner = register(client, "learner", "http://l").json["worker_id"]
    assert learner
    sampled = post(client, f"/api/v1/jobs/{job_id}/samples", {"batch_size": 8, "num_batches": 2})
    assert sampled.status_code == 200, sampled.json
    core.snapshot_jobs()
    assert post(client, f"/api/v1/jobs/{job_id}/priorities", {"keys": [], "priorities": []})
    client.delete(f"/api/v1/jobs/{job_id}", headers=AUTH)

    job = core.jobs[job_id]
    assert job.phase == "stopped" and job.replay is None  # the index is let go at once
    before = answers(core, job_id)
    assert before[1].inserts == 40 and before[1].samples == 16 and before[1].size == 40
    assert before[2].buffer == before[1] and len(before[2].points) >= 0
    assert read_job_record(core.store, job_id)["buffer"]["inserts"] == 40
    core.snapshot_jobs()
    # Its buffer's snapshot is of no more use: its process removed it as it let go.
    assert not core.store.exists(f"{job_id}/buffer-0/state.json")

    again = restarted(tmp_path)
    assert again.jobs[job_id].replay is None  # no index is built for an ended job
    assert answers(again, job_id) == before
    resp = get(client, f"/api/v1/jobs/{job_id}/buffer")
    assert resp.status_code == 200 and resp.json["inserts"] == 40


def test_the_summary_is_on_disk_before_the_end_is_shown(
    client,
    core,
    monkeypatch,
):
    job_id = submit(client)
    seen = {}
    write_json = core.store.write_json

    def watching(rel, data):
        if rel.endswith("summary.json"):
            seen["phase shown while the summary was written"] = core.job_status(job_id).phase
            seen["summary says"] = data["phase"]
        return write_json(rel, data)

    monkeypatch.setattr(core.store, "write_json", watching)
    core.stop_job(job_id)
    assert seen == {
        "phase shown while the summary was written": "running",
        "summary says": "stopped",
    }
    assert core.job_status(job_id).phase == "stopped"


def test_ended_tasks_leave_the_task_map_and_only_the_newest_are_remembered(tmp_path):
    core = make_coordinator(
        SharedStore(tmp_path), CoordinatorLimits(max_buffer_items=1000, ended_tasks_kept=4)
    )
    for i in range(3):
        core.register_worker(
            WorkerRegistration(role="collector", url=f"http://c{i}", slave_token="s" * 32)
        )
    task_ids = []
    for _ in range(3):
        job_id = core.submit_job(JobSubmit(config=CONFIG)).job_id
        for dispatch in core.plan():
            if dispatch.task is not None:
                core.dispatched(dispatch.task.task_id)
                task_ids.append(dispatch.task.task_id)
        assert core.tasks
        core.stop_job(job_id)
        assert core.tasks == {}  # nothing ended stays in the task map
    assert len(task_ids) > 4
    # the newest ended ones are remembered as ended (a late message: 409) ...
    assert [core.task_state(t) for t in task_ids[-4:]] == ["cancelled"] * 4
    # ... the older ones are forgotten (a late message: 404)
    assert core.task_state(task_ids[0]) is None


def test_jobs_are_listed_newest_first_in_pages_and_by_phase(
    client,
    core,
):
    ids = [submit(client) for _ in range(5)]
    for job_id in ids[:3]:
        core.stop_job(job_id)
    pages, token = [], None
    while True:
        query = "?limit=2" + (f"&page_token={token}" if token else "")
        resp = get(client, f"/api/v1/jobs{query}")
        assert resp.status_code == 200, resp.json
        pages.append([j["job_id"] for j in resp.json["jobs"]])
        token = resp.json["next_page_token"]
        if token is None:
            break
    assert pages == [ids[::-1][0:2], ids[::-1][2:4], ids[::-1][4:5]]
    ended = get(client, "/api/v1/jobs?phase=ended").json["jobs"]
    assert [j["job_id"] for j in ended] == ids[:3][::-1]
    running = get(client, "/api/v1/jobs?phase=running").json["jobs"]
    assert [j["job_id"] for j in running] == ids[3:][::-1]
    for bad, field in (
        ("?limit=0", "limit"),
        ("?limit=x", "limit"),
        ("?phase=done", "phase"),
        ("?page_token=nope", "page_token"),
    ):
        resp = get(client, f"/api/v1/jobs{bad}")
        assert resp.status_code == 400 and field in resp.json["message"], (bad, resp.json)


def test_ended_jobs_are_forgotten_after_their_retention_with_their_series(tmp_path):
    wall = WallClock()
    limits = CoordinatorLimits(max_buffer_items=1000, ended_job_retention_s=3600.0)
    core = make_coordinator(SharedStore(tmp_path), limits, wall_clock=wall)
    old = core.submit_job(JobSubmit(config=CONFIG)).job_id
    core.metrics.segments_inserted.labels(old).inc()
    core.stop_job(old)
    wall.t += 1800
    young = core.submit_job(JobSubmit(config=CONFIG)).job_id
    core.stop_job(young)
    assert f'job_id="{old}"' in generate_latest(core.metrics.registry).decode()

    wall.t += 1801  # past the first one's retention, not the second's
    core.plan()
    assert old not in core.jobs and young in core.jobs
    assert f'job_id="{old}"' not in generate_latest(core.metrics.registry).decode()
    assert core.store.exists(f"{old}/job.json")  # its folder is untouched
    again = make_coordinator(SharedStore(tmp_path), limits, wall_clock=wall)
    assert again.restore_jobs() == [young]


def test_past_the_count_kept_the_oldest_ended_jobs_go_first(tmp_path):
    wall = WallClock()
    limits = CoordinatorLimits(max_buffer_items=1000, max_ended_jobs=2)
    core = make_coordinator(SharedStore(tmp_path), limits, wall_clock=wall)
    ids = []
    for _ in range(4):
        wall.t += 1
        ids.append(core.submit_job(JobSubmit(config=CONFIG)).job_id)
        core.stop_job(ids[-1])
    running = core.submit_job(JobSubmit(config=CONFIG)).job_id
    core.plan()
    assert set(core.jobs) == {ids[2], ids[3], running}
    again = make_coordinator(SharedStore(tmp_path), limits, wall_clock=wall)
    assert set(again.restore_jobs()) == {ids[2], ids[3], running}


def test_a_job_that_ended_before_final_statistics_were_kept_says_so(tmp_path, client, core):
    job_id = submit(client)
    insert_segments(client, core, job_id, 3)
    core.stop_job(job_id)
    # An older coordinator's terminal record: no final buffer statistics.
    record = read_job_record(core.store, job_id)
    del record["buffer"]
    core.store.write_json(f"{job_id}/coordinator/record.json", {"format": 1, "job": record})
    again = restarted(tmp_path)
    assert again.job_status(job_id).phase == "stopped"
    with pytest.raises(ApiError) as refused:
        again.buffer_stats(job_id)
    assert refused.value.status == 404 and "before they were kept" in refused.value.message


def test_a_status_request_with_wait_s_is_answered_as_the_job_ends(client, core):
    """`drover run` waits for its job's end in the request, not between polls: the
    answer comes when the job ends; a running job is answered after wait_s, and an
    ended one at once."""
    job_id = submit(client)
    other = submit(client)

    def stop_once_waited_for():
        wait_until(lambda: core.job_views.end_polls.waiting == 1, timeout_s=10, what="the poll")
        core.stop_job(job_id)

    threading.Thread(target=stop_once_waited_for).start()
    started = time.monotonic()
    ended = client.get(f"/api/v1/jobs/{job_id}?wait_s=8", headers=AUTH)
    waited = time.monotonic() - started
    assert ended.status_code == 200 and ended.json["phase"] == "stopped"
    assert waited < 4  # answered at the end, not at wait_s
    started = time.monotonic()
    again = client.get(f"/api/v1/jobs/{job_id}?wait_s=5", headers=AUTH)
    assert again.json["phase"] == "stopped" and time.monotonic() - started < 1
    started = time.monotonic()
    running = client.get(f"/api/v1/jobs/{other}?wait_s=0.3", headers=AUTH)
    assert running.json["phase"] == "running" and time.monotonic() - started >= 0.25
    for bad in ("-1", "61", "x", "nan", "1e9"):
        answer = client.get(f"/api/v1/jobs/{other}?wait_s={bad}", headers=AUTH)
        assert answer.status_code == 400 and "wait_s" in answer.get_data(as_text=True), bad


def test_status_requests_waiting_for_an_end_are_bounded(tmp_path):
    """Past `max_waiting_job_polls` waiting at once, a request is answered at once (each
    waiting one holds a server thread)."""
    core = make_coordinator(SharedStore(tmp_path), CoordinatorLimits(max_waiting_job_polls=1))
    app = create_app(CoordinatorSettings(shared_dir=tmp_path, token=TOKEN), core=core)
    job_id = submit(app.test_client())
    waiter = threading.Thread(
        target=lambda: app.test_client().get(f"/api/v1/jobs/{job_id}?wait_s=2", headers=AUTH)
    )
    waiter.start()
    # the first one waits (a busy machine may take a while to start it)
    wait_until(lambda: core.job_views.end_polls.waiting == 1, timeout_s=10, what="a waiting poll")
    started = time.monotonic()
    second = app.test_client().get(f"/api/v1/jobs/{job_id}?wait_s=2", headers=AUTH)
    assert second.json["phase"] == "running" and time.monotonic() - started < 1
    core.stop_job(job_id)
    waiter.join(timeout=5)
    assert not waiter.is_alive()
