import threading

import pytest

from common.messages import TaskAssignment, parse
from services.slave.app import create_slave_app
from services.slave.core import Slave
from tests.fakes import BlockingRunner, FakeCoordinator
from tests.helpers import wait_until

TOKEN = "slave-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def task(task_id="collect-1", kind="collect", seed=0, **spec):
    if kind != "learn":
        spec = {"num_envs": 2, **spec}
    return {"task_id": task_id, "job_id": "job-1", "spec": {"kind": kind, "seed": seed, **spec}}


def started_slave(tmp_path):
    coordinator = FakeCoordinator()
    slave = Slave(
        role="collector",
        runner=BlockingRunner(),
        coordinator=coordinator,
        advertise_url="http://127.0.0.1:1",
        shared_root=tmp_path,
    )
    slave.start()
    wait_until(lambda: slave.worker_id is not None, what="registration")
    return slave, coordinator


@pytest.fixture
def setup(tmp_path):
    slave, coordinator = started_slave(tmp_path)
    app = create_slave_app("test", slave, TOKEN)
    yield app.test_client(), slave, coordinator
    slave.close(timeout_s=5)


def test_health_ready_auth(setup):
    client, _, _ = setup
    assert client.get("/healthz").json == {"ok": True, "reason": "ok"}
    assert client.get("/readyz").status_code == 200
    assert client.get("/v1/status").status_code == 401
    assert (
        client.post("/v1/tasks", json=task(), headers={"Authorization": "Bearer no"}).status_code
        == 401
    )
    assert client.get("/v1/status", headers=AUTH).json["worker_id"] == "collector-fake"
    # The coordinator calls with the secret this slave gave it, never the cluster token.
    own = {"Authorization": f"Bearer {setup[1].slave_token}"}
    assert client.get("/v1/status", headers=own).status_code == 200
    assert b"drover_tasks_total" in client.get("/metrics", headers=AUTH).data


def test_assign_busy_cancel(setup):
    client, slave, coordinator = setup
    assert client.post("/v1/tasks", json=task(), headers=AUTH).status_code == 202
    # the same assignment again (a retried POST) is accepted once
    assert client.post("/v1/tasks", json=task(), headers=AUTH).status_code == 202
    busy = client.post("/v1/tasks", json=task("collect-2"), headers=AUTH)
    assert busy.status_code == 409 and busy.json["error"] == "busy"
    # another kind may run beside it
    assert (
        client.post(
            "/v1/tasks",
            json=task(
                "evaluate-1",
                "evaluate",
                seed=7,
                episodes=1,
                policy_version=0,
                policy_path="job-1/policies/x",
            ),
            headers=AUTH,
        ).status_code
        == 202
    )
    wait_until(lambda: coordinator.completed, what="evaluate completion")
    assert coordinator.completed[0] == ("evaluate-1", {"seed": 7})
    tasks = client.get("/v1/status", headers=AUTH).json["tasks"]
    assert [t["task_id"] for t in tasks] == ["collect-1"]
    assert client.delete("/v1/tasks/collect-1", headers=AUTH).status_code == 202
    wait_until(lambda: not slave.status().tasks, what="cancel")
    assert client.delete("/v1/tasks/collect-1", headers=AUTH).status_code == 404
    assert ("collect-1", {"seed": 0}) not in coordinator.completed  # cancelled, not completed


def test_bad_assignments(setup):
    client, _, _ = setup
    learn = client.post("/v1/tasks", json=task(kind="learn"), headers=AUTH)
    assert learn.status_code == 400 and "learn" in learn.json["message"]
    bad_spec = client.post("/v1/tasks", json=task(num_envs=0), headers=AUTH)
    assert bad_spec.status_code == 400
    assert bad_spec.json["message"].startswith("spec.collect.num_envs")
    no_kind = client.post("/v1/tasks", json={"task_id": "x", "job_id": "j"}, headers=AUTH)
    assert no_kind.status_code == 400


def test_failed_task_is_reported_and_cancel_from_heartbeat(setup):
    client, slave, coordinator = setup
    client.post("/v1/tasks", json=task("collect-9", seed=13), headers=AUTH)
    wait_until(lambda: coordinator.failed, what="failure report")
    assert coordinator.failed[0][0] == "collect-9" and "unlucky" in coordinator.failed[0][1]
    client.post("/v1/tasks", json=task("collect-10"), headers=AUTH)
    coordinator.cancel_next = ["collect-10"]
    wait_until(lambda: not slave.status().tasks, what="heartbeat cancel")


def test_a_released_task_ends_and_reports_complete(setup):
    """A release ends the task's loop as a cancel does, but it reports complete: what it
    did is handed in, and the coordinator gives its worker to another job."""
    client, slave, coordinator = setup
    assert client.post("/v1/tasks/collect-1/release", headers=AUTH).status_code == 404
    client.post("/v1/tasks", json=task("collect-1", seed=3), headers=AUTH)
    assert client.post("/v1/tasks/collect-1/release", headers=AUTH).status_code == 202
    wait_until(lambda: coordinator.completed, what="the released task's report")
    assert coordinator.completed == [("collect-1", {"seed": 3})]
    assert not slave.status().tasks
    # Told by a heartbeat answer just the same (the scheduler's call may not arrive).
    client.post("/v1/tasks", json=task("collect-2", seed=4), headers=AUTH)
    coordinator.release_next = ["collect-2"]
    wait_until(lambda: len(coordinator.completed) == 2, what="the heartbeat's release")
    assert coordinator.completed[1] == ("collect-2", {"seed": 4})


class HeldRunner:
    """Runs until stopped, then returns once `go` is set."""

    kinds = frozenset({"collect"})

    def __init__(self) -> None:
        self.go = threading.Event()

    def run(self, ctx) -> dict:
        ctx.stop.wait(30)
        self.go.wait(30)
        return {"dropping": ctx.dropping()}


def test_a_cancel_after_a_release_drops_the_task(tmp_path):
    """The coordinator cancels a release that did not end within its grace: the task
    then stops as cancelled, and reports nothing."""
    coordinator, runner = FakeCoordinator(), HeldRunner()
    slave = Slave(
        role="collector",
        runner=runner,
        coordinator=coordinator,
        advertise_url="http://127.0.0.1:1",
        shared_root=tmp_path,
    )
    slave.start()
    try:
        wait_until(lambda: slave.worker_id is not None, what="registration")
        slave.assign(parse(TaskAssignment, task("collect-1")))
        assert slave.release("collect-1") and slave.cancel("collect-1")
        runner.go.set()
        wait_until(lambda: not slave.status().tasks, what="the cancel")
        assert coordinator.completed == []
        # Released alone, it reports what it did.
        slave.assign(parse(TaskAssignment, task("collect-2")))
        assert slave.release("collect-2")
        wait_until(lambda: coordinator.completed, what="the release's report")
        assert coordinator.completed == [("collect-2", {"dropping": False})]
    finally:
        slave.close(timeout_s=5)


def test_close_leaves_the_coordinator(tmp_path):
    slave, coordinator = started_slave(tmp_path)
    slave.close(timeout_s=5)
    assert coordinator.left == ["collector-fake"]


def test_a_tasks_data_credential_is_renewed_by_its_heartbeats(setup):
    """Buffer credentials expire and a restarted buffer process takes only fresh ones:
    each heartbeat answer's credential replaces the task's (and reaches what uses it
    elsewhere, a learner's feeder process, through `on_renew`)."""
    client, slave, coordinator = setup
    access = {"urls": ["http://127.0.0.1:9"], "credential": "first"}
    client.post("/v1/tasks", json=task("collect-1", data=access), headers=AUTH)
    wait_until(lambda: slave.status().tasks, what="the task")
    ctx = slave._running["collect-1"][0]
    told = []
    ctx.on_renew.append(told.append)
    assert ctx.data.bearer == "first"
    coordinator.credentials_next = {"collect-1": "second", "collect-404": "nobody's"}
    wait_until(lambda: ctx.data.bearer == "second", what="the renewed credential")
    assert told == ["second"]
