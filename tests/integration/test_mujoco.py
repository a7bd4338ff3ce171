"""SAC on MuJoCo (gymnasium's HalfCheetah-v5 through the `mujoco` package) through the
services: the example's job, on a short budget, collects, trains, evaluates and ends.
Learning it takes hours (bench, not tests)."""

from pathlib import Path

import pytest

from common.config import deep_merge
from drover.local import LocalCluster
from jobconfig import load_config_file
from tests.helpers import wait_for_end

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("mujoco")


@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "Hopper-v5"])
def test_sac_runs_a_mujoco_job_through_the_services(tmp_path, env_id):
    config = deep_merge(
        load_config_file(ROOT / "examples" / "mujoco" / "halfcheetah_sac.yaml"),
        {
            "env": {"env_id": env_id, "n_evaluator_episode": 1},
            "policy": {
                "collect": {"random_collect_size": 500},
                "eval": {"evaluator": {"eval_freq": 100}},
                "other": {"replay_buffer": {"min_size_to_sample": 500}},
            },
            "system": {"max_env_step": 2500},
        },
    )
    with LocalCluster(tmp_path / "run", num_collectors=1) as cluster:
        job_id = cluster.client.submit_job(config).job_id
        status = wait_for_end(cluster, job_id, 180)
        assert status.phase == "succeeded", status
        assert status.env_steps >= 2500 and status.train_iters > 0
        assert status.last_eval is not None  # an episode of the trained actor, scored
