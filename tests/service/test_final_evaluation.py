"""A job whose budget runs out evaluates the policy it ends with first
(`policy.eval.evaluator.final_eval`): its collect and learn tasks are stopped, one
evaluation of its newest version runs, and the job ends as its budget says once that
is in; it never waits for ever for it."""

import numpy as np
import pytest

from common.storage import SharedStore
from services.coordinator.core import CoordinatorLimits
from tests.buffer_hosts import make_coordinator, read_reports
from tests.coordinator_app import CONFIG, get, post, register, submit, write_segment

FINAL = {
    **CONFIG,
    "env": {**CONFIG["env"], "stop_value": None},
    # No evaluation before the budget: the last one is the final one.
    "policy": {
        **CONFIG["policy"],
        "eval": {"evaluator": {"eval_freq": 10_000, "final_eval": True}},
    },
    "system": {"max_env_step": 20},
}


def announce(client, core, job_id, version, train_iter):
    path, sha = core.store.write_policy(
        job_id, version, train_iter, "dqn", {"w": np.ones(2, np.float32)}
    )
    body = {"version": version, "path": path, "sha256": sha, "train_iter": train_iter}
    assert post(client, f"/api/v1/jobs/{job_id}/policies", body).status_code == 201


def spend_the_budget(client, core, job_id):
    """A collect and a learn task taken, version 1 announced, then 20 env steps in."""
    register(client, "collector", "http://c")
    register(client, "learner", "http://l")
    for dispatch in core.plan():
        core.dispatched(dispatch.task.task_id)
    announce(client, core, job_id, 1, 30)
    for seq in range(2):
        body = {"segments": [write_segment(core, job_id, seq)]}
        assert post(client, f"/api/v1/jobs/{job_id}/segments", body).status_code == 200
    read_reports(core)  # what its buffer process counted


def test_a_spent_budget_stops_collecting_and_learning_and_ends_after_the_final_evaluation(
    client, core
):
    job_id = submit(client, FINAL)
    spend_the_budget(client, core, job_id)
    status = get(client, f"/api/v1/jobs/{job_id}").json
    assert status["phase"] == "running" and status["env_steps"] == 20
    assert sorted(t.kind for t in core.state.tasks.values() if t.job_id == job_id) == []

    (evaluate,) = [d.task for d in core.plan() if d.task]  # nothing else is planned
    assert evaluate.kind == "evaluate" and evaluate.spec.policy_version == 1
    core.dispatched(evaluate.task_id)
    result = {"policy_version": 1, "returns": [30.0, 50.0], "lengths": [30, 50]}
    done = post(client, f"/api/v1/tasks/{evaluate.task_id}/complete", {"result": result})
    assert done.status_code == 200, done.json
    status = get(client, f"/api/v1/jobs/{job_id}").json
    assert status["phase"] == "succeeded" and status["reason"] == "max_env_step 20 reached"
    assert status["last_eval"]["policy_version"] == 1
    assert status["last_eval"]["return_mean"] == 40.0


def test_without_final_eval_the_budget_ends_the_job_at_once(client, core):
    config = {**FINAL, "policy": {**FINAL["policy"], "eval": {"evaluator": {"eval_freq": 10_000}}}}
    job_id = submit(client, config)
    spend_the_budget(client, core, job_id)
    status = get(client, f"/api/v1/jobs/{job_id}").json
    assert status["phase"] == "succeeded" and status["last_eval"] is None


@pytest.fixture
def clock():
    class Clock:
        now = 1000.0

        def __call__(self):
            return self.now

    return Clock()


def test_a_final_evaluation_that_never_comes_ends_the_job_after_its_timeout(tmp_path, clock):
    from services.coordinator.app import create_app
    from services.coordinator.settings import CoordinatorSettings
    from tests.coordinator_app import TOKEN

    limits = CoordinatorLimits(max_buffer_items=1000, final_eval_timeout_s=60.0)
    core = make_coordinator(SharedStore(tmp_path), limits, clock=clock)
    app = create_app(CoordinatorSettings(shared_dir=tmp_path, token=TOKEN), core=core)
    client = app.test_client()
    job_id = submit(client, FINAL)
    spend_the_budget(client, core, job_id)
    core.plan()  # its final evaluation goes to the collector, which never answers
    clock.now += 59.0
    core.plan()
    assert get(client, f"/api/v1/jobs/{job_id}").json["phase"] == "running"
    clock.now += 2.0
    core.plan()
    status = get(client, f"/api/v1/jobs/{job_id}").json
    assert status["phase"] == "succeeded" and status["reason"] == "max_env_step 20 reached"
