"""PPO through the services with the sync workflow: it learns CartPole, and every item
it trained on was collected by the version being trained."""

from pathlib import Path

import pytest

from drover.local import LocalCluster
from jobconfig import load_config_file
from tests.helpers import wait_for_end

pytestmark = [pytest.mark.processes, pytest.mark.learning]

ROOT = Path(__file__).resolve().parents[2]


def test_ppo_sync_reaches_475_on_fresh_data_only(tmp_path):
    config = load_config_file(ROOT / "examples" / "cartpole_ppo.yaml")
    with LocalCluster(tmp_path / "run", num_collectors=2) as cluster:
        job_id = cluster.client.submit_job(config).job_id
        status = wait_for_end(cluster, job_id, 240)
        assert status.phase == "succeeded", status
        assert status.last_eval.return_mean >= 475
        buffer = cluster.client.buffer_stats(job_id)
        # every sampled item was collected by the version being trained (lag 0)
        histogram = buffer["sampled_lag_histogram"]
        assert histogram[0] == buffer["samples"] > 0 and sum(histogram[1:]) == 0
        # each round trained on exactly n_sample items
        assert buffer["samples"] == buffer["sample_requests"] * 2048
