"""What the coordinator acknowledged survives a kill -9 at the worst moments: right
after a job is submitted, and right after it ends. Real processes on 127.0.0.1."""

import os
import signal
import time

import pytest

from common.storage import SharedStore
from tests.helpers import FAULT_TOLERANT_JOB as CONFIG
from tests.helpers import fast_lease_cluster, finish, wait_for_end, wait_until

pytestmark = [pytest.mark.processes, pytest.mark.chaos, pytest.mark.learning]


def kill_and_restart_coordinator(cluster):
    os.kill(cluster.coordinator.process.pid, signal.SIGKILL)
    cluster.coordinator.wait(5)
    cluster.supervise()
    cluster.wait_ready(30)


def test_a_job_answered_201_survives_a_kill_right_after(tmp_path):
    with fast_lease_cluster(tmp_path) as cluster:
        cluster.wait_for_workers()
        job_id = cluster.client.submit_job(CONFIG).job_id
        # Before any periodic snapshot could run.
        kill_and_restart_coordinator(cluster)
        status = cluster.client.job(job_id)
        assert status.phase == "running" and status.name == CONFIG["exp_name"]
        finish(cluster, job_id)


def test_a_finished_job_stays_finished_after_a_kill_right_after_its_end(tmp_path):
    with fast_lease_cluster(tmp_path) as cluster:
        cluster.wait_for_workers()
        job_id = cluster.client.submit_job(CONFIG).job_id
        # Polled often: the kill comes right after the end.
        status = wait_for_end(cluster, job_id, 180, max_interval_s=0.02)
        assert status.phase == "succeeded", status
        summary = cluster.shared_dir / job_id / "summary.json"
        written = summary.read_bytes()
        kill_and_restart_coordinator(cluster)
        again = cluster.client.job(job_id)
        assert (again.phase, again.reason, again.finished_at) == (
            status.phase,
            status.reason,
            status.finished_at,
        )
        time.sleep(2.0)  # long enough for a resurrected job to train and "succeed" again
        assert cluster.client.job(job_id).phase == "succeeded"
        assert summary.read_bytes() == written
        store = SharedStore(cluster.shared_dir)
        wait_until(
            lambda: not store.list_dir(f"{job_id}/segments"), 30, "the segments to be removed"
        )
