"""`drover plot` on the folder a real CartPole DQN job leaves."""

import pytest
from matplotlib.image import imread

from drover.cli import main
from drover.local import LocalCluster
from jobconfig import load_config_file
from tests.helpers import DEADLINE_S, EXAMPLE, wait_for_end

pytestmark = pytest.mark.processes


def test_a_finished_jobs_run_folder_plots(tmp_path, capsys):
    config = load_config_file(EXAMPLE)
    # Short: evaluations every 50 train iterations, the job ends at 3,000 env steps
    # (succeeded, or failed below its stop_value: either way it ended with evaluations).
    config["policy"]["eval"]["evaluator"]["eval_freq"] = 50
    config["system"]["max_env_step"] = 3000
    with LocalCluster(tmp_path / "run", num_collectors=2) as cluster:
        created = cluster.client.submit_job(config, name="cartpole_dqn")
        status = wait_for_end(cluster, created.job_id, DEADLINE_S)
        assert status.phase in ("succeeded", "failed") and status.last_eval is not None, status
    assert main(["plot", str(cluster.run_dir)]) == 0
    out = cluster.run_dir / "returns.png"
    assert capsys.readouterr().out == f"{out}\n"
    assert imread(out).shape[:2] == (500, 800)
