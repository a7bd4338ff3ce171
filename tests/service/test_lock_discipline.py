"""No disk work under the coordinator's lock: a store that fails when it is called
while the calling thread holds that lock, driven through a job's whole life."""

import numpy as np
import pytest
import requests

from common.storage import SharedStore
from services.coordinator.app import create_app
from services.coordinator.core import Coordinator, CoordinatorLimits
from services.coordinator.settings import CoordinatorSettings
from tests.buffer_hosts import buffer_of, make_coordinator, read_reports
from tests.coordinator_app import AUTH, CONFIG, TOKEN, register, write_segment
from tests.helpers import wait_until

DISK_METHODS = (
    "write_bytes",
    "read_bytes",
    "write_json",
    "read_json",
    "exists",
    "delete",
    "delete_tree",
    "list_dir",
    "write_segment",
    "read_segment",
    "read_segment_header",
    "segment_rows",
    "age_s",
    "write_policy",
    "read_policy",
)


class LockCheckingStore(SharedStore):
    """A SharedStore whose every disk call asserts the coordinator's lock is free."""

    core: Coordinator | None = None
    calls = 0


def _checked(name):
    def call(self, *args, **kwargs):
        if self.core is not None and self.core._lock._is_owned():
            raise AssertionError(f"SharedStore.{name} called under the coordinator's lock")
        type(self).calls += 1
        return getattr(SharedStore, name)(self, *args, **kwargs)

    return call


for _name in DISK_METHODS:
    setattr(LockCheckingStore, _name, _checked(_name))


def coordinator(root):
    store = LockCheckingStore(root)
    limits = CoordinatorLimits(max_buffer_items=1000, keep_policies=2, orphan_grace_s=0.0)
    core = make_coordinator(store, limits)
    store.core = core
    app = create_app(CoordinatorSettings(shared_dir=root, token=TOKEN), core=core)
    return core, app.test_client()


def ok(resp, status=200):
    assert resp.status_code == status, resp.json
    return resp.json


def test_a_jobs_whole_life_does_no_disk_work_under_the_lock(tmp_path):
    core, client = coordinator(tmp_path)
    job_id = ok(client.post("/api/v1/jobs", json={"config": CONFIG}, headers=AUTH), 201)["job_id"]
    collector = ok(register(client, "collector", "http://127.0.0.1:8101"), 201)
    learner = ok(register(client, "learner", "http://127.0.0.1:8201"), 201)
    tasks = {d.worker_id: d.task for d in core.plan() if d.task}
    for task in tasks.values():
        core.dispatched(task.task_id)
    as_collector = {"Authorization": f"Bearer {collector['credential']}"}
    as_learner = {"Authorization": f"Bearer {learner['credential']}"}
    collect, learn = tasks[collector["worker_id"]], tasks[learner["worker_id"]]
    epoch = learn.spec.epoch

    # inserts, an orphan its buffer process's sweep indexes, samples, priorities: at the
    # job's buffer process, with each task's credential (the coordinator does none)
    def data(task, route, body):
        resp = requests.post(
            f"{task.spec.data.urls[0]}/api/v1/jobs/{job_id}/{route}",
            json={**body, "task_id": task.task_id},
            headers={"Authorization": f"Bearer {task.spec.data.credential}"},
            timeout=10,
        )
        assert resp.status_code == 200, resp.json()
        return resp.json()

    folder = f"{collector['worker_id']}.{collect.task_id}"
    for seq in range(3):
        data(collect, "segments", {"segments": [write_segment(core, job_id, seq, worker=folder)]})
    orphan = write_segment(core, job_id, 3, worker=folder)  # written, never inserted
    columns = core.store.read_segment(orphan["path"])
    core.store.write_segment(orphan["path"], columns, header=orphan)  # as collectors write
    core.plan()
    buffer = buffer_of(core, job_id)
    wait_until(lambda: buffer.size == 40, timeout_s=20, what="the orphan indexed")
    batch = data(learn, "samples", {"batch_size": 8, "timeout_s": 0})
    keys = batch["batches"][0]["keys"]
    data(learn, "priorities", {"keys": keys, "priorities": [2.0] * len(keys)})
    read_reports(core)

    # policies announced and pruned, then an evaluation that reaches the goal
    for version in range(1, 5):
        path, sha = core.store.write_policy(job_id, version, 10 * version, "dqn", {"w": np.ones(2)})
        body = {"version": version, "path": path, "sha256": sha, "train_iter": 10 * version}
        ok(
            client.post(
                f"/api/v1/jobs/{job_id}/policies",
                json={**body, "task_id": learn.task_id, "epoch": epoch},
                headers=as_learner,
            ),
            201,
        )
    ok(client.get(f"/api/v1/jobs/{job_id}/policy", headers=AUTH))
    (evaluate,) = [d.task for d in core.plan() if d.task and d.task.kind == "evaluate"]
    core.dispatched(evaluate.task_id)
    result = {"policy_version": 4, "returns": [500.0, 500.0], "lengths": [500, 500]}
    ok(
        client.post(
            f"/api/v1/tasks/{evaluate.task_id}/complete",
            json={"result": result},
            headers=as_collector,
        )
    )
    status = ok(client.get(f"/api/v1/jobs/{job_id}", headers=AUTH))
    assert status["phase"] == "succeeded"
    assert (tmp_path / job_id / "summary.json").is_file()
    assert (tmp_path / job_id / "policies" / "best.json").is_file()
    ok(client.get(f"/api/v1/jobs/{job_id}/metrics", headers=AUTH))
    ok(client.get("/metrics", headers=AUTH))
    core.snapshot_jobs()
    core.close()
    assert not list((tmp_path / job_id / "segments").rglob("*.safetensors"))

    # a coordinator started over the same root restores it, still without the lock
    again, client = coordinator(tmp_path)
    assert again.restore_jobs() == [job_id]
    assert ok(client.get(f"/api/v1/jobs/{job_id}", headers=AUTH))["phase"] == "succeeded"
    assert LockCheckingStore.calls > 20


@pytest.mark.parametrize("stop", ["delete", "max_env_step"])
def test_a_job_shows_its_end_only_once_it_is_on_disk(tmp_path, stop):
    core, client = coordinator(tmp_path)
    config = {**CONFIG, "system": {"max_env_step": 10}}
    job_id = ok(client.post("/api/v1/jobs", json={"config": config}, headers=AUTH), 201)["job_id"]
    seen = []
    real = core.job_book.complete_end

    def complete_end(job, record):
        seen.append(core.job_status(job_id).phase)  # the record is not written yet
        real(job, record)

    core.job_book.complete_end = complete_end
    if stop == "delete":
        answer = ok(client.delete(f"/api/v1/jobs/{job_id}", headers=AUTH), 202)
        assert answer["phase"] == "stopped"  # answered once durable
    else:
        body = {"segments": [write_segment(core, job_id, 0)]}
        ok(client.post(f"/api/v1/jobs/{job_id}/segments", json=body, headers=AUTH))
        read_reports(core)  # its buffer process counted them: the budget is spent
    assert seen == ["running"]
    record = core.store.read_json(f"{job_id}/coordinator/record.json")["job"]
    assert record["phase"] == core.job_status(job_id).phase != "running"
