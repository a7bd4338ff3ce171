"""An evaluation acts only with a file the job's algorithm wrote: a policy file or a
checkpoint of another algorithm fails the collector's task with an error naming the
file and both algorithms, and the evaluate job ends failed with that error."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from algorithms.registry import ALGORITHMS
from common.checkpoint_file import Checkpoint, write_checkpoint
from common.messages import EvaluateSpec
from common.models import state_to_numpy
from common.storage import SharedStore, WrongAlgorithm
from jobconfig import resolve_job_config, with_spaces
from services.collector.core import CollectorRunner
from services.coordinator.app import create_app
from services.coordinator.core import CoordinatorLimits
from services.coordinator.settings import CoordinatorSettings
from tests.buffer_hosts import make_coordinator

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def ppo_files(store: SharedStore) -> dict[str, str]:
    """A PPO policy file and a PPO checkpoint, for a CartPole job."""
    config, _ = resolve_job_config({"policy": {"type": "ppo"}})
    learner = ALGORITHMS["ppo"].make_learner(with_spaces(config, 4, 2).policy, "cpu")
    policy_path, _ = store.write_policy("models", 1, 0, "ppo", state_to_numpy(learner.online))
    checkpoint = Checkpoint(learner.state_dict(), policy_version=1, algo="ppo")
    checkpoint_path, _ = write_checkpoint(store, "models", 0, checkpoint)
    return {"policy": policy_path, "checkpoint": checkpoint_path}


def evaluate_config(source: str, path: str) -> dict:
    """A DQN evaluate job of a file (DQN: the config's default policy.type)."""
    return {
        "env": {"env_id": "CartPole-v1"},
        "system": {"workflow": "evaluate", "evaluate": {"source": source, "path": path}},
    }


def evaluate(store: SharedStore, config: dict, spec: EvaluateSpec) -> None:
    """Run an evaluate task the way a collector runs it."""
    resolved, _ = resolve_job_config(config)
    ctx = SimpleNamespace(stopped=threading.Event().is_set, progress={})
    CollectorRunner(store).evaluate(ctx, with_spaces(resolved, 4, 2), spec)  # type: ignore[arg-type]


@pytest.mark.parametrize("source", ["policy", "checkpoint"])
def test_a_collector_refuses_to_evaluate_another_algorithms_file(tmp_path, source):
    store = SharedStore(tmp_path)
    path = ppo_files(store)[source]
    spec = EvaluateSpec(seed=0, num_envs=1, episodes=1, source=source, policy_path=path)
    with pytest.raises(WrongAlgorithm) as refused:
        evaluate(store, evaluate_config(source, path), spec)
    assert str(refused.value) == (
        f"{path} was written by algorithm 'ppo', but this job's policy.type is 'dqn'"
    )


@pytest.mark.parametrize("source", ["policy", "checkpoint"])
def test_an_evaluate_job_of_another_algorithms_file_fails_with_the_refusal(tmp_path, source):
    store = SharedStore(tmp_path)
    core = make_coordinator(store, CoordinatorLimits(max_buffer_items=1000))
    app = create_app(CoordinatorSettings(shared_dir=tmp_path, token=TOKEN), core=core)
    client = app.test_client()
    path = ppo_files(store)[source]
    config = evaluate_config(source, path)
    submitted = client.post("/api/v1/jobs", json={"config": config}, headers=AUTH)
    assert submitted.status_code == 201, submitted.json
    job_id = submitted.json["job_id"]
    body = {"role": "collector", "url": "http://c0", "slave_token": "s" * 32}
    assert client.post("/api/v1/workers", json=body, headers=AUTH).status_code == 201
    for _ in range(core.limits.max_task_failures):
        (dispatch,) = core.plan()
        task = dispatch.task
        with pytest.raises(WrongAlgorithm) as refused:
            evaluate(store, config, task.spec)
        # What the collector's slave reports (services/slave/core.py)
        error = f"{type(refused.value).__name__}: {refused.value}"
        client.post(f"/api/v1/tasks/{task.task_id}/fail", json={"error": error}, headers=AUTH)
    status = client.get(f"/api/v1/jobs/{job_id}", headers=AUTH).json
    assert status["phase"] == "failed"
    assert f"{path} was written by algorithm 'ppo'" in status["reason"]
    assert "policy.type is 'dqn'" in status["reason"]
