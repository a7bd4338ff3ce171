"""Episode and sequence items through the services: collectors record each segment's
episodes, the buffer samples sequences that never cross an episode's end, and the
learner trains on them: a DQN job with `item: episode`, and an R2D2 job on CartPole
with its velocities hidden."""

from pathlib import Path

import pytest

from common.config import deep_merge
from drover.local import LocalCluster
from jobconfig import load_config_file
from tests.helpers import wait_for_end

pytestmark = [pytest.mark.processes]

ROOT = Path(__file__).resolve().parents[2]


def test_a_dqn_job_with_episode_items_collects_trains_evaluates_and_ends(tmp_path):
    config = deep_merge(
        load_config_file(ROOT / "examples" / "cartpole_dqn.yaml"),
        {
            "env": {"stop_value": None},
            "policy": {
                "learn": {"batch_size": 8},
                "eval": {"evaluator": {"eval_freq": 100}},
                "other": {"replay_buffer": {"item": "episode", "sequence_length": 8}},
            },
            "system": {"max_train_iter": 400},
        },
    )
    with LocalCluster(tmp_path / "run", num_collectors=1) as cluster:
        job_id = cluster.client.submit_job(config).job_id
        status = wait_for_end(cluster, job_id, 120)
        assert status.phase == "succeeded", status
        assert status.train_iters >= 400 and status.last_eval is not None
        buffer = cluster.client.buffer_stats(job_id)
        assert buffer["inserts"] > 0 and buffer["samples"] > 0
        assert cluster.client.metrics(job_id)["unusable_segments"] == []


def test_an_r2d2_job_on_masked_cartpole_trains_on_sequences_and_ends(tmp_path):
    config = deep_merge(
        load_config_file(ROOT / "examples" / "cartpole_pomdp_r2d2.yaml"),
        {
            "env": {"stop_value": None},
            "policy": {"eval": {"evaluator": {"eval_freq": 100}}},
            "system": {"max_train_iter": 300},
        },
    )
    with LocalCluster(tmp_path / "run", num_collectors=1) as cluster:
        job_id = cluster.client.submit_job(config).job_id
        status = wait_for_end(cluster, job_id, 180)
        assert status.phase == "succeeded", status
        assert status.train_iters >= 300 and status.policy_version > 1
        assert status.last_eval is not None
        buffer = cluster.client.buffer_stats(job_id)
        # Items are sequences of at most 20 rows, overlapping by 10: fewer than rows.
        assert buffer["size"] > 0 and buffer["samples"] > 0
        assert cluster.client.metrics(job_id)["unusable_segments"] == []
