"""A job on CUDA trains only on learners that report CUDA devices, and its collectors
act on CUDA where they have it and on CPU where not, unless `policy.collect.device:
cuda` asks for CUDA collectors only. A role that needs CUDA is refused at submission
when it has only CPU workers, waits (with the reason in its status) when none is
registered, and is never given to a worker without CUDA."""

import os

import pytest
import torch

from common.config import deep_merge
from common.devices import local_resources
from common.messages import CollectSpec
from common.settings import SlaveSettings
from services.collector.app import create_app as collector_app
from services.coordinator.workflows import WORKFLOWS
from services.coordinator.workflows.training import AsyncTraining
from services.learner.app import create_app as learner_app
from services.slave.core import EXTENSION, Slave
from tests.coordinator_app import (
    CONFIG,
    get,
    planned,
    post,
    reason,
    register_worker,
    submit,
)
from tests.fakes import BlockingRunner, FakeCoordinator
from tests.helpers import wait_until

CUDA = deep_merge(CONFIG, {"policy": {"cuda": True}})
#: A CUDA job whose collectors act only on CUDA.
CUDA_ACTING = deep_merge(CUDA, {"policy": {"collect": {"device": "cuda"}}})
CPU_ONLY = {"cuda_devices": 0, "cpu_count": 8}
ONE_GPU = {"cuda_devices": 1, "cpu_count": 8}


@pytest.mark.parametrize(
    ("policy", "field"),
    [({"cuda": True}, "config.policy.cuda"), ({"device": "cuda"}, "config.policy.device")],
)
def test_a_cuda_job_is_refused_when_the_registered_learners_have_no_cuda(client, policy, field):
    register_worker(client, "collector", "http://c", ONE_GPU)
    register_worker(client, "learner", "http://l", CPU_ONLY)
    resp = post(client, "/api/v1/jobs", {"config": deep_merge(CONFIG, {"policy": policy})})
    assert resp.status_code == 400
    message = resp.json["message"]
    assert message.startswith(f"{field}: ")
    assert "none of the 1 registered learners has one" in message
    fix = "policy.cuda: false" if field.endswith("cuda") else "policy.device: cpu"
    assert f"set {fix}" in message
    # the same config on CPU is taken
    assert post(client, "/api/v1/jobs", {"config": CONFIG}).status_code == 201


def test_a_cuda_job_collects_on_collectors_without_cuda(client, core):
    # a GPU learner and CPU collectors: the collectors act on CPU (collect.device auto)
    collector = register_worker(client, "collector", "http://c", CPU_ONLY)
    learner = register_worker(client, "learner", "http://l", ONE_GPU)
    job_id = post(client, "/api/v1/jobs", {"config": CUDA}).json["job_id"]
    assert sorted(planned(core)) == sorted([(collector, "collect"), (learner, "learn")])
    assert reason(client, job_id) == ""


def test_a_job_acting_only_on_cuda_is_refused_when_the_collectors_have_no_cuda(client):
    register_worker(client, "collector", "http://c", CPU_ONLY)
    register_worker(client, "learner", "http://l", ONE_GPU)
    resp = post(client, "/api/v1/jobs", {"config": CUDA_ACTING})
    assert resp.status_code == 400
    message = resp.json["message"]
    assert message.startswith("config.policy.collect.device: cuda needs a collector with CUDA")
    assert "none of the 1 registered collectors has one" in message
    assert "set policy.collect.device: auto" in message


def test_a_worker_that_reports_no_devices_does_not_count_as_cuda(client):
    register_worker(client, "collector", "http://c", ONE_GPU)
    register_worker(client, "learner", "http://l", {})
    assert post(client, "/api/v1/jobs", {"config": CUDA}).status_code == 400


def test_a_cuda_evaluation_needs_no_learner_with_cuda(client):
    register_worker(client, "collector", "http://c", ONE_GPU)
    register_worker(client, "learner", "http://l", CPU_ONLY)
    evaluate = deep_merge(CUDA, {"system": {"workflow": "evaluate"}})
    assert post(client, "/api/v1/jobs", {"config": evaluate}).status_code == 201


def test_an_evaluation_acting_only_on_cuda_needs_a_collector_with_cuda(client):
    register_worker(client, "collector", "http://c", CPU_ONLY)
    evaluate = deep_merge(CUDA, {"system": {"workflow": "evaluate"}})
    assert post(client, "/api/v1/jobs", {"config": evaluate}).status_code == 201
    acting = deep_merge(CUDA_ACTING, {"system": {"workflow": "evaluate"}})
    resp = post(client, "/api/v1/jobs", {"config": acting})
    assert resp.status_code == 400
    assert resp.json["message"].startswith("config.policy.collect.device: cuda needs a collector")


def test_a_cuda_job_waits_for_cuda_workers_and_is_never_given_to_cpu_ones(client, core):
    # nothing registered yet: accepted, and the answer says it waits
    created = post(client, "/api/v1/jobs", {"config": CUDA_ACTING}).json
    job_id = created["job_id"]
    assert any("waiting for a collector and a learner with CUDA" in w for w in created["warnings"])
    assert "waiting for a collector and a learner with CUDA" in reason(client, job_id)
    cpu_collector = register_worker(client, "collector", "http://c0", CPU_ONLY)
    cpu_learner = register_worker(client, "learner", "http://l0", CPU_ONLY)
    assert planned(core) == []
    waiting = reason(client, job_id)
    assert (
        "waiting for a collector and a learner with CUDA "
        "(policy.collect.device: cuda, policy.cuda: true)" in waiting
    )
    assert "set policy.collect.device: auto and policy.cuda: false" in waiting
    assert get(client, f"/api/v1/jobs/{job_id}").json["phase"] == "running"
    gpu_learner = register_worker(client, "learner", "http://l1", ONE_GPU)
    assert planned(core) == [(gpu_learner, "learn")]
    assert reason(client, job_id).startswith("waiting for a collector with CUDA")
    gpu_collector = register_worker(client, "collector", "http://c1", {"cuda_devices": 2})
    assert planned(core) == [(gpu_collector, "collect")]
    assert reason(client, job_id) == ""
    assert {t.worker_id for t in core.tasks.values()} == {gpu_learner, gpu_collector}
    assert cpu_collector in core.workers and cpu_learner in core.workers
    # what each worker reported is listed with it
    workers = {w["worker_id"]: w for w in get(client, "/api/v1/workers").json["workers"]}
    assert workers[gpu_collector]["resources"] == {"cuda_devices": 2}
    assert workers[cpu_learner]["resources"] == CPU_ONLY


def test_a_cpu_job_runs_on_any_worker(client, core):
    job_id = submit(client)
    register_worker(client, "collector", "http://c", ONE_GPU)
    register_worker(client, "learner", "http://l", CPU_ONLY)
    assert [kind for _, kind in planned(core)] == ["collect", "learn"]
    assert reason(client, job_id) == ""


def test_a_sync_round_is_split_over_the_collectors_that_can_run_it(client, core):
    ppo = {
        "env": {"env_id": "CartPole-v1"},
        "policy": {
            "type": "ppo",
            "cuda": True,
            "collect": {"n_sample": 64, "device": "cuda"},
            "other": {"replay_buffer": {"replay_buffer_size": 1000}},
        },
    }
    submit(client, ppo)
    register_worker(client, "learner", "http://l", ONE_GPU)
    register_worker(client, "collector", "http://c0", ONE_GPU)
    register_worker(client, "collector", "http://c1", CPU_ONLY)
    collects = [d.task.spec for d in core.plan() if d.task and d.task.kind == "collect"]
    # one collector can run it: it collects the whole round, not half of it
    assert [spec.round_steps for spec in collects] == [64]


class Careless(AsyncTraining):
    """A workflow that gives a task to every registered worker, not asking
    `free_workers` which of them can run the job."""

    def __init__(self, workers):
        self.workers = workers  # the coordinator's, by id

    def plan(self, job, planner):
        return [
            planner.assign(job, w, CollectSpec(seed=planner.seed(job), num_envs=1))
            for w in self.workers.values()
        ]


def test_a_task_is_never_assigned_to_a_worker_without_the_jobs_device(
    client,
    core,
    monkeypatch,
):
    monkeypatch.setitem(WORKFLOWS, "careless", Careless(core.workers))
    submit(client, deep_merge(CUDA_ACTING, {"system": {"workflow": "careless"}}))
    register_worker(client, "collector", "http://c", CPU_ONLY)
    # the job's planning is refused and undone; no task exists
    assert core.plan() == []
    assert core.tasks == {}


# --- what slaves report -------------------------------------------------------------


def test_a_slave_registers_with_its_resources(tmp_path):
    coordinator = FakeCoordinator()
    slave = Slave(
        role="learner",
        runner=BlockingRunner(),
        coordinator=coordinator,
        advertise_url="http://127.0.0.1:1",
        shared_root=tmp_path,
        resources=ONE_GPU,
    )
    slave.start()
    try:
        wait_until(lambda: slave.worker_id is not None, what="registration")
        assert coordinator.registrations == [ONE_GPU]
    finally:
        slave.close(timeout_s=5)


@pytest.mark.parametrize(
    ("role", "create_app"), [("collector", collector_app), ("learner", learner_app)]
)
def test_collectors_and_learners_report_this_machines_devices(tmp_path, role, create_app):
    settings = SlaveSettings(
        host="127.0.0.1",
        port=1,
        advertise_url="http://127.0.0.1:1",
        coordinator_url="http://127.0.0.1:2",
        shared_dir=tmp_path,
        token="t",
    )
    slave = create_app(settings).extensions[EXTENSION]
    assert slave.role == role
    expected = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert slave.resources == {"cuda_devices": expected, "cpu_count": os.cpu_count()}
    assert slave.resources == local_resources()
