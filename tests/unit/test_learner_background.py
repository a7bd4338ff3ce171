"""A learn task's publishes and checkpoints written off its training thread: versions
in order, weights as they were when handed off, failures raised on the training thread."""

import threading

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from algorithms.dqn.learner import DQN
from common.errors import ApiError
from common.messages import LearnSpec, TaskAssignment
from common.storage import SharedStore
from jobconfig import resolve_job_config, with_spaces
from services.learner.background import BackgroundWrites, copy_state
from services.learner.guards import NonFiniteWeights
from services.learner.sampling import JobOver
from services.learner.sessions import BatchSession
from services.slave.core import TaskContext

JOB = "job-1"


class Coordinator:
    """Announces recorded; `gate` holds each announce until it is set."""

    def __init__(self, fail_with=None):
        self.announced = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_with = fail_with

    def announce_policy(self, job_id, ref, *, task_id=None):
        self.gate.wait(10)
        if self.fail_with is not None:
            raise self.fail_with
        self.announced.append(ref)


def session(tmp_path, coordinator):
    config, _ = resolve_job_config({"policy": {"type": "dqn"}})
    config = with_spaces(config, 4, 2)
    ctx = TaskContext(
        task=TaskAssignment(task_id="t-1", job_id=JOB, spec=LearnSpec(seed=0)),
        worker_id="learner-1",
        coordinator=coordinator,  # type: ignore[arg-type]
        data=coordinator,  # type: ignore[arg-type]
        metrics=CollectorRegistry(),
    )
    return BatchSession(ctx, config, SharedStore(tmp_path), DQN(config.policy), 0)


def test_versions_are_written_in_order_from_the_weights_they_were_handed_off_with(tmp_path):
    coordinator = Coordinator()
    learn = session(tmp_path, coordinator)
    coordinator.gate.clear()  # the first announce waits: the second must wait for it
    learn.publish_soon()
    first = {k: v.clone() for k, v in learn.learner.online.state_dict().items()}
    with torch.no_grad():
        for p in learn.learner.online.parameters():
            p.add_(1.0)  # training goes on meanwhile
    threading.Timer(0.2, coordinator.gate.set).start()
    learn.publish_soon()
    learn.writes.wait()
    assert [ref.version for ref in coordinator.announced] == [1, 2]
    assert learn.version == 2 and learn.ctx.progress["policy_version"] == 2
    policy = learn.store.read_policy(coordinator.announced[0].path)
    for name, tensor in first.items():
        np.testing.assert_array_equal(policy.tensors[name], tensor.numpy())
    learn.writes.close()


def test_a_failed_announce_is_raised_on_the_training_thread(tmp_path):
    learn = session(tmp_path, Coordinator(fail_with=ApiError(404, "job_finished", "gone")))
    learn.publish_soon()
    with pytest.raises(JobOver):
        learn.writes.wait()
    learn.writes.check()  # raised once, then forgotten
    learn.writes.close()


def test_non_finite_weights_are_refused_when_handed_off(tmp_path):
    coordinator = Coordinator()
    learn = session(tmp_path, coordinator)
    with torch.no_grad():
        next(learn.learner.online.parameters())[0].fill_(float("nan"))
    with pytest.raises(NonFiniteWeights):
        learn.publish_soon()
    with pytest.raises(NonFiniteWeights):
        learn.checkpoint_soon()
    learn.writes.close()
    assert learn.version == 0 and coordinator.announced == []
    assert learn.store.list_dir(f"{JOB}/checkpoints") == []


def test_a_checkpoint_handed_off_holds_the_state_of_then(tmp_path):
    learn = session(tmp_path, Coordinator())
    learn.learner.train_iter = 7
    learn.checkpoint_soon()
    learn.learner.train_iter = 8
    learn.writes.close()
    assert learn.store.list_dir(f"{JOB}/checkpoints") == [
        learn.store.checkpoint_path(JOB, 7).rsplit("/", 1)[1]
    ]


def test_jobs_run_one_at_a_time_in_order():
    writes = BackgroundWrites("test")
    done = []
    for i in range(5):
        writes.submit(done.append, i)
    writes.wait()
    writes.close()
    assert done == [0, 1, 2, 3, 4]


def test_copy_state_copies_every_tensor():
    state = {"a": torch.zeros(3), "b": [torch.ones(2), 3], "c": {"d": torch.zeros(1)}}
    copied = copy_state(state)
    state["a"].add_(1)
    state["b"][0].add_(1)
    state["c"]["d"].add_(1)
    assert copied["a"].tolist() == [0, 0, 0] and copied["b"][0].tolist() == [1, 1]
    assert copied["b"][1] == 3 and copied["c"]["d"].tolist() == [0]
