"""Population-based training through the coordinator's routes
(services/coordinator/population.py): a member behind the others, once `ready`
evaluations came, takes a better member's newest checkpoint under a new learn lease
epoch, its learner cancelled and fenced, and the better one's learning rate perturbed
in its job.json;
the step is in the experiment's lineage and survives a restart; a bad `pbt:` section
is refused before any job exists."""

import dataclasses

import numpy as np
import pytest

from common.messages import PopulationStep
from common.storage import CorruptFileError, SharedStore, checkpoint_key
from jobconfig import read_job_config
from services.coordinator.core import CoordinatorLimits
from tests.buffer_hosts import make_coordinator
from tests.coordinator_app import CONFIG, get, post, register

LRS = [0.001, 0.002]


def population(**pbt):
    config = {**CONFIG, "env": {**CONFIG["env"], "stop_value": None}}
    return {
        **config,
        "sweep": {"axes": {"policy.learn.learning_rate": LRS}},
        "pbt": {"ready": 1, "params": ["policy.learn.learning_rate"], "perturb": [2.0], **pbt},
    }


def learn_tasks(core):
    """The learn task of each job, by job id, dispatched."""
    tasks = {}
    for dispatch in core.plan():
        if dispatch.task is not None:
            core.dispatched(dispatch.task.task_id)
            if dispatch.task.kind == "learn":
                tasks[dispatch.task.job_id] = dispatch.task
    return tasks


def publish(client, core, job_id, task, version, train_iter):
    path, sha = core.store.write_policy(
        job_id, version, train_iter, "dqn", {"w": np.ones(2, np.float32)}, epoch=task.spec.epoch
    )
    body = {
        "version": version,
        "path": path,
        "sha256": sha,
        "train_iter": train_iter,
        "epoch": task.spec.epoch,
        "task_id": task.task_id,
    }
    return post(client, f"/api/v1/jobs/{job_id}/policies", body)


def evaluations(core):
    """The evaluations the next pass plans, by job id, dispatched."""
    due = {}
    for dispatch in core.plan():
        if dispatch.task is not None and dispatch.task.kind == "evaluate":
            core.dispatched(dispatch.task.task_id)
            due[dispatch.task.job_id] = dispatch.task
    return due


def complete(client, task, mean):
    """The evaluation's result: returns of `mean`."""
    result = {
        "policy_version": task.spec.policy_version,
        "returns": [mean, mean],
        "lengths": [9, 9],
    }
    done = post(client, f"/api/v1/tasks/{task.task_id}/complete", {"result": result})
    assert done.status_code == 200, done.json


def start(client, core, config):
    """The experiment of `config` with two learners and two collectors: its id, its
    two jobs, and their learn tasks."""
    created = post(client, "/api/v1/experiments", {"config": config})
    assert created.status_code == 201, created.json
    for role, name in (
        ("learner", "l1"),
        ("learner", "l2"),
        ("collector", "c1"),
        ("collector", "c2"),
    ):
        register(client, role, f"http://{name}")
    tasks = learn_tasks(core)
    assert set(tasks) == set(created.json["job_ids"])
    return created.json["experiment_id"], *created.json["job_ids"], tasks


def test_the_member_behind_takes_the_better_ones_checkpoint_and_a_new_rate(tmp_path, client, core):
    experiment_id, weak, strong, tasks = start(client, core, population())
    # The strong member has a checkpoint; both publish and are evaluated.
    donor_checkpoint = core.store.checkpoint_path(strong, 500, tasks[strong].spec.epoch)
    core.store.write_bytes(donor_checkpoint, b"the strong member's checkpoint")
    for job_id in (weak, strong):
        assert publish(client, core, job_id, tasks[job_id], 1, 500).status_code == 201
    due = evaluations(core)
    complete(client, due[strong], 200.0)
    assert get(client, f"/api/v1/experiments/{experiment_id}").json["lineage"] == []
    old_epoch = core.jobs[weak].learner_epoch
    complete(client, due[weak], 20.0)  # ready, and in the bottom: a step

    shown = get(client, f"/api/v1/experiments/{experiment_id}").json
    (step,) = shown["lineage"]
    assert (step["job_id"], step["donor_id"]) == (weak, strong)
    assert (step["eval_return"], step["donor_return"]) == (20.0, 200.0)
    assert step["before"] == {"policy.learn.learning_rate": LRS[0]}
    assert step["after"] == {"policy.learn.learning_rate": 2 * LRS[1]}  # the donor's, x2
    assert step["checkpoint"] == donor_checkpoint.rsplit("/", 1)[1]
    assert shown["population"]["ready"] == 1
    # The copy sorts past anything the weak member's old learner wrote, and its old
    # learner can publish no more.
    names = core.store.checkpoints(weak)
    assert checkpoint_key(names[-1]) == (old_epoch + 1, 500)
    assert (
        core.store.read_bytes(f"{weak}/checkpoints/{names[-1]}")
        == b"the strong member's checkpoint"
    )
    refused = publish(client, core, weak, tasks[weak], 2, 600)
    assert refused.status_code == 409, refused.json
    assert read_job_config(core.store, weak).policy.learn.learning_rate == 2 * LRS[1]
    assert core.jobs[weak].config.policy.learn.learning_rate == 2 * LRS[1]
    # Its next learner's lease is past the copy's, which it resumes from.
    again = learn_tasks(core)
    assert again[weak].spec.epoch == old_epoch + 2
    assert core.store.checkpoints(weak, up_to_epoch=again[weak].spec.epoch)[-1] == names[-1]
    # An evaluation of the line it left, which came after its step, counts for nothing.
    step_version = core.jobs[weak].policy.version
    late = dataclasses.replace(core.jobs[weak].evals[-1], policy_version=step_version)
    core.jobs[weak].evals.append(late)
    core.planning.population.evaluated(core.jobs[weak])
    shown = get(client, f"/api/v1/experiments/{experiment_id}").json
    assert len(shown["lineage"]) == 1 and shown["lineage"][0]["policy_version"] == step_version
    core.jobs[weak].evals.pop()
    # The strong member, evaluated again, is not behind: no step for it.
    assert publish(client, core, strong, tasks[strong], 2, 700).status_code == 201
    core.jobs[strong].env_steps += 100  # an evaluation waits for env steps past the last
    complete(client, evaluations(core)[strong], 250.0)
    assert len(get(client, f"/api/v1/experiments/{experiment_id}").json["lineage"]) == 1

    # The lineage is appended to a file of its own (the record is not rewritten with
    # it), back after a restart; a step cut short by a crash mid-append is left out.
    core.snapshot_jobs()
    core.close()
    lineage = tmp_path / "experiments" / f"{experiment_id}.lineage.jsonl"
    assert len(lineage.read_text().splitlines()) == 1
    assert "lineage" not in core.store.read_json(f"experiments/{experiment_id}.json")
    with lineage.open("a") as f:
        f.write('{"at": 1.0, "job_id": "job-cut-sh')
    restarted = make_coordinator(SharedStore(tmp_path), CoordinatorLimits(max_buffer_items=1000))
    try:
        restarted.restore_jobs()
        (kept,) = restarted.experiment_status(experiment_id).lineage
        assert isinstance(kept, PopulationStep) and kept.donor_id == strong
        assert restarted.jobs[weak].config.policy.learn.learning_rate == 2 * LRS[1]
    finally:
        restarted.close()


def test_a_value_its_config_refuses_stays_as_it_was_and_no_checkpoint_only_explores(client, core):
    # The donor's target_theta 0.8 doubled is past its bound of 1: the member takes
    # 0.8 as it is; the donor's rate doubled.
    config = population(params=["policy.learn.learning_rate", "policy.learn.target_theta"])
    config["policy"] = {**config["policy"], "learn": {"target_theta": 0.8}}
    experiment_id, weak, strong, tasks = start(client, core, config)
    for job_id in (weak, strong):
        assert publish(client, core, job_id, tasks[job_id], 1, 500).status_code == 201
    due = evaluations(core)
    complete(client, due[strong], 200.0)
    complete(client, due[weak], 20.0)
    (step,) = get(client, f"/api/v1/experiments/{experiment_id}").json["lineage"]
    assert step["after"] == {
        "policy.learn.learning_rate": 2 * LRS[1],
        "policy.learn.target_theta": 0.8,
    }
    assert step["checkpoint"] is None  # the donor had written none: only explored
    assert core.jobs[weak].config.policy.learn.target_theta == 0.8


@pytest.mark.parametrize(
    ("pbt", "field"),
    [
        ({"params": ["policy.learn.learning_rat"]}, "pbt.params.policy.learn.learning_rat"),
        ({"params": ["env.stop_value"]}, "pbt.params.env.stop_value"),
        ({"params": ["policy.learn.learning_rate"], "quantile": 0.9}, "pbt.quantile"),
        ({"params": ["policy.learn.learning_rate"], "perturb": [0]}, "pbt.perturb"),
        ({"params": ["policy.learn.learning_rate"], "reddy": 1}, "pbt.reddy"),
        ({"params": ["policy.learn.batch_size"]}, "pbt.params.policy.learn.batch_size"),
        ({"params": []}, "pbt.params"),
    ],
)
def test_a_bad_pbt_section_is_refused_before_any_job_exists(client, core, pbt, field):
    config = population()
    config["pbt"] = pbt
    refused = post(client, "/api/v1/experiments", {"config": config})
    assert refused.status_code == 400, refused.json
    assert refused.json["message"].startswith(f"{field}:"), refused.json
    assert get(client, "/api/v1/jobs").json["jobs"] == []


def test_a_population_runs_every_member_at_once(client, core):
    config = population()
    config["sweep"]["parallel"] = 1
    refused = post(client, "/api/v1/experiments", {"config": config})
    assert refused.status_code == 400 and refused.json["message"].startswith("sweep.parallel:")
    assert get(client, "/api/v1/experiments").json["experiments"] == []


def test_a_step_that_cannot_copy_still_gives_the_member_a_learner(client, core, monkeypatch):
    experiment_id, weak, strong, tasks = start(client, core, population())
    core.store.write_bytes(core.store.checkpoint_path(strong, 500, 1), b"checkpoint")
    for job_id in (weak, strong):
        assert publish(client, core, job_id, tasks[job_id], 1, 500).status_code == 201

    def damaged(src, dst, **_):
        raise CorruptFileError(f"{src} is a symbolic link, not a regular file")

    monkeypatch.setattr(core.store, "copy", damaged)
    due = evaluations(core)
    complete(client, due[strong], 200.0)
    complete(client, due[weak], 20.0)
    (step,) = get(client, f"/api/v1/experiments/{experiment_id}").json["lineage"]
    assert step["checkpoint"] is None and step["after"] == step["before"]  # nothing changed
    assert core.jobs[weak].learn_hold == ""
    assert weak in learn_tasks(core)  # its next learner, at the next pass
