"""A shared volume that fills in the middle of a job and has room again later pauses
the job; it does not end it: collectors and the learner try their writes again, the
coordinator and the buffer process keep their last good snapshots, and the job
succeeds with every acknowledged insert counted (a real tmpfs as the shared root;
mounting one needs root)."""

import json
import time

import pytest
import yaml

from common.config import deep_merge
from drover.local import LocalCluster
from tests.helpers import EXAMPLES, fill, tmpfs, wait_for_end, wait_until

pytestmark = [pytest.mark.processes, pytest.mark.chaos]

#: The example's DQN without a goal (its learner sets the pace: samples_per_insert),
#: 1-step transitions, so a segment's rows are its env steps.
JOB = deep_merge(
    yaml.safe_load((EXAMPLES / "cartpole_dqn.yaml").read_text()),
    {
        "env": {"stop_value": None, "n_evaluator_episode": 2},
        "policy": {"nstep": 1},
        "system": {"max_env_step": 8000},
    },
)
FULL_FOR_S = 20


@pytest.fixture
def volume(tmp_path):
    with tmpfs(tmp_path / "volume", "300m") as root:
        yield root


def test_a_volume_full_for_a_while_pauses_the_job_and_it_succeeds(volume):
    with LocalCluster(volume / "run", num_collectors=2) as cluster:
        cluster.wait_for_workers()
        job_id = cluster.client.submit_job(JOB).job_id
        wait_until(lambda: cluster.client.job(job_id).train_iters > 0, 90, "training")
        filler = volume / "filler"
        fill(filler)
        full_at = time.monotonic()
        # The coordinator shows the condition: its tasks' heartbeats say they wait.
        wait_until(
            lambda: cluster.client.job(job_id).storage_full_s is not None,
            FULL_FOR_S,
            "the job's status to say it waits for room",
        )
        time.sleep(max(0.0, FULL_FOR_S - (time.monotonic() - full_at)))
        assert cluster.client.job(job_id).phase == "running"
        filler.unlink()  # room again
        status = wait_for_end(cluster, job_id, 240)
        assert status.phase == "succeeded", status
        assert status.storage_full_s is None
        # The pointer writes that found no room were kept and landed: it names the
        # newest version.
        (pointer,) = (volume / "run").rglob(f"{job_id}/policies/latest.json")
        assert json.loads(pointer.read_text())["version"] == status.policy_version
        buffer = cluster.client.buffer_stats(job_id)
        assert buffer["inserts"] == status.env_steps, (buffer, status)
        logs = "".join(p.read_text(errors="replace") for p in cluster.log_dir.glob("*.log"))
        assert "has no room for segment" in logs  # the collectors did wait for room
