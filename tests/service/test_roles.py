"""Credentials have roles: what a worker's own credential, the registration secret and
the cluster token may each do, through the coordinator's routes."""

import numpy as np
import pytest
import requests

from common.storage import SharedStore
from services.coordinator.app import create_app
from services.coordinator.core import CoordinatorLimits
from services.coordinator.settings import CoordinatorSettings
from tests.buffer_hosts import buffer_of, make_coordinator
from tests.coordinator_app import (
    AUTH,
    CONFIG,
    SLAVE_TOKEN,
    TOKEN,
    insert_segments,
    post,
    register,
    submit,
    write_segment,
)
from tests.helpers import wait_until

REGISTRATION = "registration-secret"


@pytest.fixture
def core(tmp_path):
    return make_coordinator(SharedStore(tmp_path), CoordinatorLimits(max_buffer_items=1000))


@pytest.fixture
def client(tmp_path, core):
    settings = CoordinatorSettings(
        shared_dir=tmp_path, token=TOKEN, registration_token=REGISTRATION
    )
    return create_app(settings, core=core).test_client()


def bearer(secret):
    return {"Authorization": f"Bearer {secret}"}


def running_job(client, core):
    """A job with a collector and a learner holding their tasks."""
    job_id = submit(client)
    collector = register(client, "collector", "http://127.0.0.1:8101").json
    learner = register(client, "learner", "http://127.0.0.1:8201").json
    tasks = {d.worker_id: d.task for d in core.plan() if d.task is not None}
    for task in tasks.values():
        core.dispatched(task.task_id)
    return job_id, collector, learner, tasks


def test_a_worker_credential_does_only_its_roles_work(client, core):
    job_id, collector, learner, tasks = running_job(client, core)
    as_collector, as_learner = bearer(collector["credential"]), bearer(learner["credential"])
    learn_task = tasks[learner["worker_id"]].task_id
    operator_only = [
        ("GET", "/api/v1/jobs", None),
        ("POST", "/api/v1/jobs", {"config": CONFIG}),
        ("GET", f"/api/v1/jobs/{job_id}", None),
        ("DELETE", f"/api/v1/jobs/{job_id}", None),
        ("GET", f"/api/v1/jobs/{job_id}/metrics", None),
        ("GET", f"/api/v1/jobs/{job_id}/policy", None),
        ("GET", f"/api/v1/jobs/{job_id}/buffer", None),
        ("GET", "/api/v1/workers", None),
        ("GET", "/metrics", None),
        (
            "POST",
            "/api/v1/workers",
            {"role": "collector", "url": "http://127.0.0.1:9", "slave_token": SLAVE_TOKEN},
        ),
    ]
    for credential in (as_collector, as_learner):
        for method, path, body in operator_only:
            resp = client.open(path, method=method, json=body, headers=credential)
            assert resp.status_code == 403, (method, path, resp.json)
            assert resp.json["error"] == "forbidden"
    samples = f"/api/v1/jobs/{job_id}/samples"
    priorities = f"/api/v1/jobs/{job_id}/priorities"
    # a collector may not sample or set priorities, even naming the learner's task
    for path, body in (
        (samples, {"batch_size": 4, "timeout_s": 0, "task_id": learn_task}),
        (priorities, {"keys": [0], "priorities": [1.0], "task_id": learn_task}),
    ):
        assert client.post(path, json=body, headers=as_collector).status_code == 403
    # a worker's data goes where its task's data access says (its buffer process checks
    # the task there: tests/service/test_buffer_process.py): here, acting for another's
    # task is refused as such, and its own is sent there
    other = {"batch_size": 4, "timeout_s": 0, "task_id": tasks[collector["worker_id"]].task_id}
    assert client.post(samples, json=other, headers=as_learner).status_code == 403
    own = {"batch_size": 4, "timeout_s": 0, "task_id": learn_task}
    for body in ({"batch_size": 4, "timeout_s": 0}, own):
        resp = client.post(samples, json=body, headers=as_learner)
        assert resp.status_code == 409 and resp.json["error"] == "data_elsewhere", resp.json
    # a learner may not insert segments
    ref = write_segment(core, job_id, 0)
    resp = client.post(
        f"/api/v1/jobs/{job_id}/segments",
        json={"segments": [ref], "task_id": learn_task},
        headers=as_learner,
    )
    assert resp.status_code == 403


def test_progress_from_a_collect_task_does_not_move_train_iters(client, core):
    job_id, collector, learner, tasks = running_job(client, core)
    collect_task = tasks[collector["worker_id"]].task_id
    resp = client.post(
        f"/api/v1/workers/{collector['worker_id']}/heartbeat",
        json={
            "tasks": [
                {"task_id": collect_task, "state": "running", "progress": {"train_iter": 1e9}}
            ]
        },
        headers=bearer(collector["credential"]),
    )
    assert resp.status_code == 200
    assert client.get(f"/api/v1/jobs/{job_id}", headers=AUTH).json["train_iters"] == 0


def test_policies_are_read_only_by_workers_of_the_job(client, core):
    job_id, collector, _, _ = running_job(client, core)
    idle = register(client, "collector", "http://127.0.0.1:8102").json
    latest = f"/api/v1/jobs/{job_id}/policies/latest"
    assert client.get(latest, headers=bearer(collector["credential"])).status_code == 204
    assert client.get(latest, headers=bearer(idle["credential"])).status_code == 403


def test_the_registration_secret_only_registers(client):
    body = {"role": "collector", "url": "http://127.0.0.1:8103", "slave_token": SLAVE_TOKEN}
    assert client.post("/api/v1/workers", json=body, headers=bearer(REGISTRATION)).status_code == (
        201
    )
    assert client.get("/api/v1/workers", headers=bearer(REGISTRATION)).status_code == 403
    assert client.get("/api/v1/jobs", headers=bearer(REGISTRATION)).status_code == 403


def test_the_scheduler_calls_workers_with_their_own_secret(client, core):
    running = running_job(client, core)
    dispatches = [d for d in core.plan()]  # nothing new: every worker is busy
    assert dispatches == []
    core.stop_job(running[0])
    cancels = core.plan()
    assert cancels and all(d.auth == SLAVE_TOKEN and d.auth != TOKEN for d in cancels)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://127.0.0.1:21", "http"),
        ("http://user:pw@127.0.0.1:1", "user name"),
        ("http://127.0.0.1:1/x?y=1", "no path"),
        ("http://169.254.169.254", "not an address"),
        ("http://0.0.0.0:80", "not an address"),
        ("http://[ff02::1]:80", "not an address"),
        ("http://bad_host!:80", "not a host name"),
        ("http://127.0.0.1:99999", "not a valid URL"),
        ("javascript:alert(1)", "http"),
    ],
)
def test_advertised_urls_are_checked(client, url, why):
    resp = register(client, "collector", url)
    assert resp.status_code == 400 and resp.json["message"].startswith("url")
    assert why in resp.json["message"]


def test_an_allow_list_narrows_worker_hosts(tmp_path):
    limits = CoordinatorLimits(worker_hosts=("10.1.0.0/16", "collector-0.drover"))
    core = make_coordinator(SharedStore(tmp_path), limits)
    client = create_app(CoordinatorSettings(shared_dir=tmp_path, token=TOKEN), core=core)
    client = client.test_client()
    assert register(client, "collector", "http://10.1.2.3:8100").status_code == 201
    assert register(client, "collector", "http://collector-0.drover:8100").status_code == 201
    refused = register(client, "collector", "http://127.0.0.1:8100")
    assert refused.status_code == 400 and "DROVER_WORKER_HOSTS" in refused.json["message"]


def test_registrations_are_bounded(tmp_path):
    core = make_coordinator(SharedStore(tmp_path), CoordinatorLimits(max_workers=2))
    client = create_app(CoordinatorSettings(shared_dir=tmp_path, token=TOKEN), core=core)
    client = client.test_client()
    for port in (1, 2):
        assert register(client, "collector", f"http://127.0.0.1:{port}").status_code == 201
    full = register(client, "collector", "http://127.0.0.1:3")
    assert full.status_code == 503 and full.json["error"] == "too_many_workers"
    big = {
        "role": "collector",
        "url": "http://127.0.0.1:4",
        "slave_token": SLAVE_TOKEN,
        "resources": {f"k{i}": i for i in range(33)},
    }
    assert post(client, "/api/v1/workers", big).status_code == 400
    # Far past the bound, it is refused before it is parsed.
    huge = dict(big, resources={f"k{i}": i for i in range(1000)})
    assert post(client, "/api/v1/workers", huge).status_code == 413
    nested = dict(big, resources={"gpu": {"deep": [1, 2, 3]}})
    assert post(client, "/api/v1/workers", nested).status_code == 400


def test_a_failing_job_does_not_stop_the_others(client, core, monkeypatch):
    bad, good = submit(client), submit(client)
    # A collector each: the two jobs share the collectors.
    register(client, "collector", "http://127.0.0.1:8101")
    register(client, "collector", "http://127.0.0.1:8102")
    real = core.planning.plan_job

    def plan_job(job):
        if job.job_id == bad:
            real(job)  # tasks are created, then the pass fails
            raise OverflowError("a value no job should hold")
        return real(job)

    monkeypatch.setattr(core.planning, "plan_job", plan_job)
    plan = core.plan()
    assert {d.task.job_id for d in plan if d.task} == {good}
    # nothing the failed pass created is left waiting for a dispatch
    assert not [t for t in core.tasks.values() if t.job_id == bad and t.state == "assigning"]


def test_a_worker_that_never_answers_is_dropped(tmp_path):
    now = [0.0]
    core = make_coordinator(SharedStore(tmp_path), CoordinatorLimits(), clock=lambda: now[0])
    client = create_app(CoordinatorSettings(shared_dir=tmp_path, token=TOKEN), core=core)
    client = client.test_client()
    submit(client)
    worker = register(client, "collector", "http://127.0.0.1:9").json["worker_id"]
    for failure in range(core.limits.max_dispatch_failures):
        (dispatch,) = core.plan()
        core.dispatch_failed(dispatch.task.task_id, "timed out")
        assert core.plan() == []  # backing off
        now[0] += 2.0**failure + 0.1  # each wait is twice the last
    assert worker not in core.workers


def test_an_assignment_never_confirmed_is_planned_again(tmp_path):
    now = [0.0]
    core = make_coordinator(
        SharedStore(tmp_path),
        CoordinatorLimits(assigning_timeout_s=5.0, lease_timeout_s=1e9),
        clock=lambda: now[0],
    )
    client = create_app(CoordinatorSettings(shared_dir=tmp_path, token=TOKEN), core=core)
    client = client.test_client()
    submit(client)
    register(client, "collector", "http://127.0.0.1:8101")
    (first,) = core.plan()
    assert core.plan() == []  # its assignment is still in flight
    now[0] = 6.0
    assert core.plan() == []  # lost, and its worker held back for a second
    assert core.task_state(first.task.task_id) == "lost"
    now[0] = 7.1
    (again,) = core.plan()
    assert again.task.task_id != first.task.task_id


def test_priorities_and_samples_are_bounded(client, core):
    job_id = submit(client)
    huge = post(client, f"/api/v1/jobs/{job_id}/priorities", {"keys": [0], "priorities": [1e300]})
    assert huge.status_code == 400 and huge.json["message"].startswith("priorities.0")
    many = post(
        client,
        f"/api/v1/jobs/{job_id}/samples",
        {"batch_size": 8192, "num_batches": 256, "timeout_s": 0},
    )
    assert many.status_code == 400 and many.json["message"].startswith("num_batches")
    for query in ("99999999999", "1" * 5000, "-1", "１"):
        resp = client.get(f"/api/v1/jobs/{job_id}/policy?version={query}", headers=AUTH)
        assert resp.status_code == 400, query
    assert np.isfinite(buffer_of(core, job_id).sampler.max_priority)


def test_items_held_for_a_learner_that_leaves_go_back_to_the_buffer(client, core):
    fifo = {
        **CONFIG,
        "policy": {
            "learn": {"batch_size": 8, "num_batches": 1},
            "other": {
                "replay_buffer": {
                    "type": "fifo",
                    "replay_buffer_size": 1000,
                    "min_size_to_sample": 8,
                    "samples_per_insert": None,
                }
            },
        },
    }
    job_id = submit(client, fifo)
    insert_segments(client, core, job_id, 2)

    def learner_takes(url):
        learner = register(client, "learner", url).json
        (dispatch,) = [d for d in core.plan() if d.worker_id == learner["worker_id"]]
        core.dispatched(dispatch.task.task_id)
        return learner, dispatch.task

    def sample(task, batch_size):
        """At the job's buffer process, as its learner does."""
        return requests.post(
            f"{task.spec.data.urls[0]}/api/v1/jobs/{job_id}/samples",
            json={"batch_size": batch_size, "timeout_s": 0, "task_id": task.task_id},
            headers=bearer(task.spec.data.credential),
            timeout=10,
        )

    def buffer():
        return client.get(f"/api/v1/jobs/{job_id}/buffer", headers=AUTH).json

    first, task = learner_takes("http://127.0.0.1:8201")
    got = sample(task, 8)
    assert got.status_code == 200 and got.json()["hold_id"]
    assert buffer()["size"] == 12 and buffer()["held_items"] == 8
    # The learner dies with the items (here: it leaves; a lost lease is the same).
    client.delete(f"/api/v1/workers/{first['worker_id']}", headers=bearer(first["credential"]))
    wait_until(lambda: buffer()["held_items"] == 0, what="the held items given back")
    assert buffer()["size"] == 20
    second, task = learner_takes("http://127.0.0.1:8202")
    got = sample(task, 20)
    assert got.status_code == 200 and len(got.json()["batches"][0]["keys"]) == 20


def test_an_evaluation_lost_with_its_worker_is_requested_again_at_once(client, core):
    job_id = submit(client)
    first = register(client, "collector", "http://127.0.0.1:8101").json
    for dispatch in core.plan():
        core.dispatched(dispatch.task.task_id)
    path, sha = core.store.write_policy(job_id, 1, 10, "dqn", {"w": np.ones(2, np.float32)})
    post(
        client,
        f"/api/v1/jobs/{job_id}/policies",
        {"version": 1, "path": path, "sha256": sha, "train_iter": 10},
    )
    (evaluate,) = [d for d in core.plan() if d.task and d.task.kind == "evaluate"]
    core.dispatched(evaluate.task.task_id)
    # Its collector leaves (or loses its lease) before reporting.
    client.delete(f"/api/v1/workers/{first['worker_id']}", headers=AUTH)
    register(client, "collector", "http://127.0.0.1:8102")
    again = [d.task for d in core.plan() if d.task and d.task.kind == "evaluate"]
    assert len(again) == 1 and again[0].spec.policy_version == 1
    # Its collect and evaluate tasks count as reassigned, not failed.
    status = client.get(f"/api/v1/jobs/{job_id}", headers=AUTH).json
    assert (status["tasks_reassigned"], status["task_failures"]) == (2, 0)


def test_a_collector_waits_for_a_newer_policy_instead_of_polling(client, core):
    import threading
    import time

    job_id, collector, learner, tasks = running_job(client, core)
    latest = f"/api/v1/jobs/{job_id}/policies/latest"
    as_collector = bearer(collector["credential"])
    learn = tasks[learner["worker_id"]]
    path, sha = core.store.write_policy(job_id, 1, 10, "dqn", {"w": np.ones(2, np.float32)})
    announce = {"version": 1, "path": path, "sha256": sha, "train_iter": 10}
    announce |= {"task_id": learn.task_id, "epoch": learn.spec.epoch}

    def publish_soon():
        time.sleep(0.3)
        client.application.test_client().post(
            f"/api/v1/jobs/{job_id}/policies",
            json=announce,
            headers=bearer(learner["credential"]),
        )

    threading.Thread(target=publish_soon).start()
    started = time.monotonic()
    got = client.get(f"{latest}?newer_than=0&timeout_s=5", headers=as_collector)
    waited = time.monotonic() - started
    assert got.status_code == 200 and got.json["version"] == 1
    assert 0.2 < waited < 3  # answered when the version came, not at the timeout
    # nothing newer: the wait ends at its timeout with the current version
    started = time.monotonic()
    same = client.get(f"{latest}?newer_than=1&timeout_s=0.3", headers=as_collector)
    assert same.json["version"] == 1 and time.monotonic() - started >= 0.25
    for bad in ("newer_than=-1", "newer_than=1&timeout_s=61", "newer_than=x", "timeout_s=nan"):
        assert client.get(f"{latest}?{bad}", headers=as_collector).status_code == 400, bad
