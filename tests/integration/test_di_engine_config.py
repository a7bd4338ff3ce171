"""A DI-engine PPO config file, as DI-engine's users write them, trains PPO through
the services on DI-engine's CartPole (v0, goal 195)."""

import pytest

from drover.local import LocalCluster
from jobconfig import load_config
from tests.helpers import DI_ENGINE_FILE, wait_for_end

pytestmark = [pytest.mark.processes, pytest.mark.learning]


def test_a_di_engine_ppo_file_trains_ppo_to_its_goal(tmp_path):
    path = tmp_path / "cartpole_ppo_config.py"
    path.write_text(DI_ENGINE_FILE)
    raw, _ = load_config(path)
    with LocalCluster(tmp_path / "run", num_collectors=2) as cluster:
        job_id = cluster.client.submit_job(raw).job_id
        status = wait_for_end(cluster, job_id, 240)
    assert (status.algo, status.env_id) == ("ppo", "CartPole-v0")
    assert status.phase == "succeeded", status
    assert status.last_eval.return_mean >= 195
