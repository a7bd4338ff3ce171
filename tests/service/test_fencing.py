"""The coordinator's side of fencing (docs/architecture.md, "Fencing"): each learn task
gets a higher lease epoch, an announcement of another epoch than its task's is
refused, a lost learner's task cannot publish, and a restarted coordinator passes over
a policy file of a stale lease and hands out epochs past every one of before."""

import numpy as np

from common.storage import SharedStore
from services.coordinator.core import CoordinatorLimits
from services.coordinator.policies import RESTART_EPOCH_GAP
from tests.buffer_hosts import make_coordinator
from tests.coordinator_app import AUTH, register, submit


def job_with_learner(client, core, url="http://127.0.0.1:8201"):
    """A submitted job and a learner holding its learn task: (job id, credential
    header, the task's assignment)."""
    job_id = submit(client)
    learner = register(client, "learner", url).json
    (task,) = [d.task for d in core.plan() if d.task is not None and d.task.kind == "learn"]
    core.dispatched(task.task_id)
    return job_id, {"Authorization": f"Bearer {learner['credential']}"}, task


def announce(client, core, job_id, headers, version, **fields):
    path, sha = core.store.write_policy(job_id, version, 10 * version, "dqn", {"w": np.ones(2)})
    body = {"version": version, "path": path, "sha256": sha, "train_iter": 10 * version}
    return client.post(f"/api/v1/jobs/{job_id}/policies", json=body | fields, headers=headers)


def test_an_announcement_of_another_epoch_than_its_tasks_is_refused(client, core):
    job_id, as_learner, task = job_with_learner(client, core)
    assert task.spec.epoch == core.jobs[job_id].learner_epoch == 1
    stale = announce(client, core, job_id, as_learner, 1, task_id=task.task_id, epoch=0)
    assert (stale.status_code, stale.json["error"]) == (409, "stale_epoch"), stale.json
    assert "epoch" in stale.json["message"]
    fresh = announce(client, core, job_id, as_learner, 2, task_id=task.task_id, epoch=1)
    assert fresh.status_code == 201, fresh.json
    assert (core.jobs[job_id].policy.version, core.jobs[job_id].policy.epoch) == (2, 1)


def test_a_lost_learners_task_cannot_publish_and_its_successor_has_a_higher_epoch(client, core):
    job_id, as_old, old = job_with_learner(client, core)
    # Its worker leaves (as at lease expiry): the task is lost, a new learner takes over.
    worker = core.tasks[old.task_id].worker_id
    assert client.delete(f"/api/v1/workers/{worker}", headers=AUTH).status_code == 202
    new_learner = register(client, "learner", "http://127.0.0.1:8202").json
    (new,) = [d.task for d in core.plan() if d.task is not None and d.task.kind == "learn"]
    core.dispatched(new.task_id)
    assert new.spec.epoch == 2 and core.jobs[job_id].learner_epoch == 2
    as_new = {"Authorization": f"Bearer {new_learner['credential']}"}
    assert (
        announce(client, core, job_id, as_new, 1, task_id=new.task_id, epoch=2).status_code == 201
    )
    late = announce(client, core, job_id, as_new, 2, task_id=old.task_id, epoch=1)
    assert late.status_code in (403, 409), late.json
    assert core.jobs[job_id].policy.version == 1


def test_a_restart_passes_over_a_stale_leases_file_and_skips_epochs(tmp_path, client, core):
    job_id, _, task = job_with_learner(client, core)
    epoch = task.spec.epoch
    core.snapshot_jobs()
    store = core.store
    # Written after the snapshot: version 1 by the lease the snapshot knows, version 2
    # by an older one that woke late (never announced).
    store.write_policy(job_id, 1, 10, "dqn", {"w": np.ones(2)}, epoch=epoch)
    store.write_policy(job_id, 2, 20, "dqn", {"w": np.ones(2)}, epoch=epoch - 1)
    core.close()

    again = make_coordinator(SharedStore(tmp_path), CoordinatorLimits(max_buffer_items=1000))
    try:
        again.restore_jobs()
        job = again.jobs[job_id]
        assert (job.policy.version, job.policy.epoch) == (1, epoch)
        assert job.learner_epoch == epoch + RESTART_EPOCH_GAP
    finally:
        again.close()


def test_two_restarts_within_one_snapshot_period_never_hand_out_an_epoch_twice(
    tmp_path, client, core
):
    """The epoch a restart raises is durable before the job is published: a second
    restart before any snapshot raises it again from there (docs/architecture.md:
    epochs are never handed out twice)."""
    job_id, _, task = job_with_learner(client, core)
    core.snapshot_jobs()
    core.close()
    seen = [task.spec.epoch]
    for _ in range(2):  # no snapshot in between: the snapshot's epoch is the first's
        again = make_coordinator(SharedStore(tmp_path), CoordinatorLimits(max_buffer_items=1000))
        try:
            again.restore_jobs()
            register(again_client(tmp_path, again), "learner", "http://127.0.0.1:8203")
            (learn,) = [d.task for d in again.plan() if d.task and d.task.kind == "learn"]
            seen.append(learn.spec.epoch)
        finally:
            again.close()
    assert seen[0] < seen[1] < seen[2], seen
    assert seen[2] - seen[1] >= RESTART_EPOCH_GAP


def again_client(tmp_path, core):
    from services.coordinator.app import create_app
    from services.coordinator.settings import CoordinatorSettings
    from tests.coordinator_app import TOKEN

    settings = CoordinatorSettings(shared_dir=tmp_path, token=TOKEN)
    return create_app(settings, core=core).test_client()


def test_a_restart_on_a_full_volume_waits_for_room_to_make_its_epoch_durable(
    tmp_path, client, core, monkeypatch
):
    """Restarted while the volume is full (its reserve spent too), the coordinator
    waits for room to write the raised epoch, instead of exiting at start."""
    import errno

    job_id, _, _ = job_with_learner(client, core)
    core.snapshot_jobs()
    core.close()
    again = make_coordinator(
        SharedStore(tmp_path), CoordinatorLimits(max_buffer_items=1000, record_reserve_bytes=0)
    )
    real, refused = again.store.write_json, []

    def full_twice(rel, record):
        if rel.endswith("epoch.json") and len(refused) < 2:
            refused.append(rel)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(rel, record)

    monkeypatch.setattr(again.store, "write_json", full_twice)
    monkeypatch.setattr("common.storage_full.RETRY_BASE_S", 0.01)
    try:
        again.restore_jobs()
        assert len(refused) == 2
        assert again.jobs[job_id].learner_epoch > RESTART_EPOCH_GAP
        assert (tmp_path / job_id / "coordinator" / "epoch.json").exists()
    finally:
        again.close()
