"""The evaluate workflow through real processes: random actions, a policy file and a
learner checkpoint, each run for N episodes across two collectors."""

import csv
import io

import pytest

from algorithms.dqn.learner import DQN
from common.checkpoint_file import Checkpoint, write_checkpoint
from common.models import state_to_numpy
from common.storage import SharedStore
from drover.local import LocalCluster
from jobconfig import resolve_job_config, with_spaces
from tests.helpers import wait_for_end

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("eval") / "run", num_collectors=2) as running:
        running.wait_for_workers()  # so both collectors share the episodes
        yield running


@pytest.fixture(scope="module")
def models(cluster) -> tuple[str, str]:
    """A policy version and a checkpoint of an untrained DQN, written once (a version
    is written once)."""
    store = SharedStore(cluster.shared_dir)
    config, _ = resolve_job_config({})
    dqn = DQN(with_spaces(config, 4, 2).policy)
    policy_path, _ = store.write_policy("models", 7, 0, "dqn", state_to_numpy(dqn.online))
    checkpoint = Checkpoint(dqn.state_dict(), policy_version=7, algo="dqn")
    checkpoint_path, _ = write_checkpoint(store, "models", 0, checkpoint)
    return policy_path, checkpoint_path


@pytest.mark.parametrize("source", ["random", "policy", "checkpoint"])
def test_evaluate_workflow_runs_the_episodes_and_writes_results(cluster, models, source):
    store = SharedStore(cluster.shared_dir)
    policy_path, checkpoint_path = models
    path = {"random": None, "policy": policy_path, "checkpoint": checkpoint_path}[source]
    config = {
        "env": {"env_id": "CartPole-v1", "evaluator_env_num": 3},
        "system": {
            "workflow": "evaluate",
            "evaluate": {"source": source, "path": path, "episodes": 12},
        },
    }
    job_id = cluster.client.submit_job(config).job_id
    status = wait_for_end(cluster, job_id, 120)
    assert status.phase == "succeeded", status
    assert status.last_eval.episodes == 12
    rows = list(
        csv.DictReader(io.StringIO(store.read_bytes(f"{job_id}/eval/results.csv").decode()))
    )
    assert len(rows) == 12
    assert len({row["task_id"] for row in rows}) == 2  # both collectors took a share
    returns = [float(row["return"]) for row in rows]
    assert all(8 <= r <= 500 for r in returns)  # CartPole: 8+ steps before it can fall
    results = store.read_json(f"{job_id}/eval/results.json")
    assert results["summary"]["return_mean"] == pytest.approx(sum(returns) / 12)
