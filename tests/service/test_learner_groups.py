"""The coordinator and a learner group: a job goes only to a learner whose ranks split
its batches (refused at submission when none can, waiting otherwise), a data-parallel
job (`policy.learn.multi_gpu`) goes to the biggest group, and a job's status shows the
group training it with its world size and per-rank throughput."""

from common.config import deep_merge
from tests.coordinator_app import (
    CONFIG,
    get,
    planned,
    post,
    reason,
    register_worker,
)

SOLO = {"cuda_devices": 0, "cpu_count": 8}


def group(ranks):
    return {**SOLO, "learner_ranks": ranks, "rank_devices": ",".join(["cpu"] * ranks)}


BATCH_64 = deep_merge(CONFIG, {"policy": {"learn": {"batch_size": 64}}})


def test_a_job_whose_batch_does_not_split_over_the_only_group_is_refused(client):
    register_worker(client, "collector", "http://c", SOLO)
    register_worker(client, "learner", "http://l3", group(3))
    resp = post(client, "/api/v1/jobs", {"config": BATCH_64})
    assert resp.status_code == 400
    assert resp.json["message"] == (
        "config.policy.learn.batch_size: 64 does not split evenly over a learner group "
        "of 3 ranks: use a multiple of 3 (each rank trains on an equal share)"
    )
    # a batch that splits over 3 ranks is taken
    fits = deep_merge(CONFIG, {"policy": {"learn": {"batch_size": 63}}})
    assert post(client, "/api/v1/jobs", {"config": fits}).status_code == 201


def test_a_job_never_goes_to_a_group_it_does_not_split_over(client, core):
    register_worker(client, "collector", "http://c", SOLO)
    # submitted before any learner registered: taken, and waits for one it splits over
    job_id = post(client, "/api/v1/jobs", {"config": BATCH_64}).json["job_id"]
    three = register_worker(client, "learner", "http://l3", group(3))
    assert [kind for _, kind in planned(core)] == ["collect"]
    assert reason(client, job_id) == (
        "waiting for a learner whose ranks split the job's batches: policy.learn.batch_size "
        "64 does not split evenly over a learner group of 3 ranks: use a multiple of 3 "
        "(each rank trains on an equal share)"
    )
    two = register_worker(client, "learner", "http://l2", group(2))
    assert planned(core) == [(two, "learn")]
    assert three not in {worker for worker, _ in planned(core)}
    assert reason(client, job_id) == ""


def test_a_multi_gpu_job_goes_to_the_biggest_group(client, core):
    register_worker(client, "learner", "http://solo", SOLO)
    biggest = register_worker(client, "learner", "http://l4", group(4))
    register_worker(client, "learner", "http://l2", group(2))
    config = deep_merge(BATCH_64, {"policy": {"learn": {"multi_gpu": True}}})
    post(client, "/api/v1/jobs", {"config": config})
    assert planned(core) == [(biggest, "learn")]


def test_a_jobs_status_shows_the_group_training_it(client, core):
    learner = register_worker(client, "learner", "http://l2", group(2))
    job_id = post(client, "/api/v1/jobs", {"config": BATCH_64}).json["job_id"]
    (dispatch,) = [d for d in core.plan() if d.task]
    core.dispatched(dispatch.task.task_id)
    progress = {
        "train_iters_per_s": 30.0,
        "samples_per_s": 210.0,
        "world_size": 2,
        "rank_0_samples_per_s": 100.0,
        "rank_1_samples_per_s": 110.0,
    }
    task = {"task_id": dispatch.task.task_id, "state": "running", "progress": progress}
    beat = post(client, f"/api/v1/workers/{learner}/heartbeat", {"tasks": [task]})
    assert beat.status_code == 200
    (summary,) = get(client, f"/api/v1/jobs/{job_id}").json["learners"]
    assert summary == {
        "worker_id": learner,
        "world_size": 2,
        "rank_devices": ["cpu", "cpu"],
        "train_iters_per_s": 30.0,
        "samples_per_s": 210.0,
        "rank_samples_per_s": [100.0, 110.0],
    }
    (listed,) = [w for w in get(client, "/api/v1/workers").json["workers"]]
    assert listed["resources"]["learner_ranks"] == 2
    assert listed["progress"][dispatch.task.task_id]["rank_1_samples_per_s"] == 110.0
