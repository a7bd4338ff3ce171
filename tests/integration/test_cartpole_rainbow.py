"""DI-engine's CartPole Rainbow file (examples/di_engine/) trains Rainbow through the
services to its stop value (CartPole-v0, 195)."""

import pytest

from drover.local import LocalCluster
from jobconfig import load_config
from tests.helpers import DEADLINE_S, EXAMPLES, wait_for_end

pytestmark = [pytest.mark.processes, pytest.mark.learning]


def test_di_engines_cartpole_rainbow_file_reaches_its_stop_value(tmp_path):
    raw, _ = load_config(EXAMPLES / "di_engine" / "cartpole_rainbow_config.py")
    with LocalCluster(tmp_path / "run", num_collectors=2) as cluster:
        job_id = cluster.client.submit_job(raw).job_id
        status = wait_for_end(cluster, job_id, DEADLINE_S)
    assert (status.algo, status.env_id) == ("rainbow", "CartPole-v0")
    assert status.phase == "succeeded", status
    assert status.last_eval.return_mean >= 195
