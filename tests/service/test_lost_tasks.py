"""Workers that lose their tasks are held back: a task its worker confirmed and then
does not list in its heartbeats (it accepted the task and does not run it), or never
confirmed, is planned again on another worker while that one waits, twice as long for
each further task it loses; a job whose evaluations stall says so."""

import numpy as np
import pytest

from common.storage import SharedStore
from services.coordinator.app import create_app
from services.coordinator.core import CoordinatorLimits
from services.coordinator.settings import CoordinatorSettings
from tests.buffer_hosts import make_coordinator
from tests.coordinator_app import AUTH, CONFIG, TOKEN, get, post, register, submit

ONE_COLLECTOR = {**CONFIG, "system": {"collector_num": 1}}


@pytest.fixture
def now():
    return [0.0]


@pytest.fixture
def core(tmp_path, now):
    limits = CoordinatorLimits(lease_timeout_s=1e9, dispatch_backoff_s=4.0, max_backoff_s=20.0)
    return make_coordinator(SharedStore(tmp_path), limits, clock=lambda: now[0])


@pytest.fixture
def client(tmp_path, core):
    settings = CoordinatorSettings(shared_dir=tmp_path, token=TOKEN)
    return create_app(settings, core=core).test_client()


def beat(client, worker, task_ids=()):
    """A heartbeat of `worker` listing `task_ids` as running."""
    tasks = [{"task_id": t, "state": "running", "progress": {}} for t in task_ids]
    resp = post(client, f"/api/v1/workers/{worker}/heartbeat", {"tasks": tasks})
    assert resp.status_code == 200, resp.json


def confirmed(core, kind=None):
    """The next pass's assignments (of `kind`), each confirmed by its worker."""
    dispatches = [d for d in core.plan() if d.task and kind in (None, d.task.kind)]
    for dispatch in dispatches:
        core.dispatched(dispatch.task.task_id)
    return dispatches


def publish(client, core, job_id, version, train_iter):
    path, sha = core.store.write_policy(
        job_id, version, train_iter, "dqn", {"w": np.ones(2, np.float32)}
    )
    body = {"version": version, "path": path, "sha256": sha, "train_iter": train_iter}
    assert post(client, f"/api/v1/jobs/{job_id}/policies", body).status_code == 201


def worker_row(client, worker_id):
    (row,) = [
        w for w in get(client, "/api/v1/workers").json["workers"] if w["worker_id"] == worker_id
    ]
    return row


def test_an_evaluation_its_collector_does_not_run_goes_to_another_which_is_held_back(
    client, core, now
):
    job_id = submit(client, ONE_COLLECTOR)
    good = register(client, "collector", "http://127.0.0.1:8101").json["worker_id"]
    (collect,) = confirmed(core)
    assert collect.worker_id == good
    # An idle collector is first in line for evaluations: this one takes them and
    # never runs them (a broken env, a stuck task runner).
    bad = register(client, "collector", "http://127.0.0.1:8102").json["worker_id"]
    publish(client, core, job_id, 1, 10)
    core.jobs[job_id].env_steps = 100
    (evaluate,) = confirmed(core, "evaluate")
    assert evaluate.worker_id == bad
    beat(client, good, [collect.task.task_id])
    beat(client, bad)
    assert core.task_state(evaluate.task.task_id) == "running"  # one beat may race
    beat(client, bad)
    assert core.task_state(evaluate.task.task_id) == "lost"
    row = worker_row(client, bad)
    assert (row["held_back_s"], row["lost_tasks"]) == (4.0, 1)
    assert worker_row(client, good)["held_back_s"] == 0.0
    # The evaluation goes out again at once, to the job's own collector, busy
    # collecting: the only one not held back.
    (again,) = confirmed(core, "evaluate")
    assert again.worker_id == good
    assert core.jobs[job_id].workflow_state.evaluations_lost == 1


def test_each_task_lost_in_a_row_holds_a_worker_back_twice_as_long_up_to_the_cap(client, core, now):
    submit(client)
    worker = register(client, "collector", "http://127.0.0.1:8101").json["worker_id"]
    held = []
    for _ in range(4):
        (collect,) = confirmed(core)
        beat(client, worker)
        beat(client, worker)
        assert core.task_state(collect.task.task_id) == "lost"
        held.append(worker_row(client, worker)["held_back_s"])
        assert confirmed(core) == []  # held back: nothing planned for it
        now[0] += held[-1] + 0.1
    assert held == [4.0, 8.0, 16.0, 20.0]
    # A task it runs and reports clears the count.
    (collect,) = confirmed(core)
    beat(client, worker, [collect.task.task_id])
    beat(client, worker, [collect.task.task_id])
    beat(client, worker)  # one beat missing (say, a beat sent before a restart): kept
    assert core.task_state(collect.task.task_id) == "running"
    core.complete_task(collect.task.task_id, {})
    assert worker_row(client, worker)["lost_tasks"] == 0


def test_a_learner_that_never_confirms_its_learn_task_is_held_back(client, core, now):
    submit(client)
    learner = register(client, "learner", "http://127.0.0.1:8201").json["worker_id"]
    (learn,) = [d for d in core.plan() if d.task and d.task.kind == "learn"]
    now[0] += core.limits.assigning_timeout_s + 1
    assert core.plan() == []
    assert core.task_state(learn.task.task_id) == "lost"
    row = worker_row(client, learner)
    assert row["lost_tasks"] == 1 and row["held_back_s"] == pytest.approx(4.0, abs=0.01)
    now[0] += 4.1
    (again,) = [d for d in core.plan() if d.task and d.task.kind == "learn"]
    assert again.worker_id == learner


def test_a_job_whose_evaluations_stall_says_why_in_its_status_and_a_metric(client, core, now):
    job_id = submit(client)  # eval_freq 10
    bad = register(client, "collector", "http://127.0.0.1:8101").json["worker_id"]
    confirmed(core)
    publish(client, core, job_id, 1, 10)
    job = core.jobs[job_id]
    for train_iters in (10, 20, 30):
        job.env_steps += 100
        job.train_iters = train_iters
        (evaluate,) = [d for d in confirmed(core) if d.task.kind == "evaluate"]
        beat(client, bad)
        beat(client, bad)
        assert core.task_state(evaluate.task.task_id) == "lost"
        now[0] += 100.0  # past its hold
    core.plan()
    status = get(client, f"/api/v1/jobs/{job_id}").json
    assert status["train_iters_since_eval"] == 30
    assert (
        "no evaluation for 30 train iterations (eval_freq 10): 3 evaluations lost"
        in (status["reason"])
    )
    metrics = client.get("/metrics", headers=AUTH).get_data(as_text=True)
    assert f'drover_job_train_iters_since_eval{{job_id="{job_id}"}} 30.0' in metrics
    assert 'drover_tasks_lost_by_worker_total{kind="evaluate"} 3.0' in metrics
