"""Failures injected into real processes on 127.0.0.1: the job survives each one.

Every assertion reads public status (the REST API, the shared folder a user sees);
each wait has a deadline. Leases are short here (3 s) so the tests stay quick
(tests.helpers.FAST_LEASES).
"""

import os
import signal
import time

import numpy as np
import pytest

from common.config import deep_merge
from common.errors import ApiError
from common.messages import SegmentRef
from common.storage import SharedStore
from tests.helpers import FAULT_TOLERANT_JOB as CONFIG
from tests.helpers import child_processes, fast_lease_cluster, finish, running, wait_until

pytestmark = [pytest.mark.processes, pytest.mark.chaos, pytest.mark.learning]


def tasks_by_role(cluster):
    out = {}
    for worker in cluster.client.workers():
        kinds = [t.split("-")[0] for t in worker.task_ids]
        out.setdefault(worker.role, []).append((worker.worker_id, worker.url, kinds))
    return out


def test_collector_killed_then_replaced(tmp_path):
    with fast_lease_cluster(tmp_path) as cluster:
        job_id = cluster.client.submit_job(CONFIG).job_id
        wait_until(lambda: cluster.client.job(job_id).env_steps > 500, 60, "collection")
        victim = cluster.collectors[0]
        os.kill(victim.process.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        victim.wait(5)
        # the other collector goes on alone
        before = cluster.client.job(job_id).env_steps
        wait_until(lambda: cluster.client.job(job_id).env_steps > before + 500, 60, "more data")
        # a replacement registers and is given a collect task
        cluster.supervise()
        wait_until(
            lambda: sum(
                "collect" in k
                for _, url, k in tasks_by_role(cluster)["collector"]
                if url == victim.url
            ),
            60,
            "the restarted collector's task",
        )
        print(f"replacement collecting {time.monotonic() - killed_at:.1f}s after the kill")
        finish(cluster, job_id)
    # nothing the killed collector wrote is left behind
    job_dir = cluster.run_dir / job_id
    assert not [p for p in (job_dir / "segments").rglob("*") if p.is_file()]


def test_stopped_collector_loses_its_lease_and_its_late_messages_are_refused(tmp_path):
    config = deep_merge(CONFIG, {"system": {"collector_num": 2}})
    with fast_lease_cluster(tmp_path, collectors=3) as cluster:
        job_id = cluster.client.submit_job(config).job_id
        busy = lambda: [w for w in tasks_by_role(cluster).get("collector", []) if w[2]]  # noqa: E731
        wait_until(lambda: len(busy()) == 2, 60, "two busy collectors")
        worker_id, url, _ = busy()[0]
        old_task = next(w for w in cluster.client.workers() if w.worker_id == worker_id).task_ids[0]
        victim = next(s for s in cluster.collectors if s.url == url)
        os.kill(victim.process.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        # the idle collector takes over within the lease plus a scheduling period
        wait_until(
            lambda: (
                worker_id not in {w.worker_id for w in cluster.client.workers()}
                and len(busy()) == 2
            ),
            30,
            "reassignment",
        )
        print(f"task reassigned {time.monotonic() - stopped_at:.1f}s after SIGSTOP (lease 3s)")
        # a late insert for the lost task is refused, not counted
        env_steps = cluster.client.job(job_id).env_steps
        store = SharedStore(cluster.shared_dir)
        path = store.segment_path(job_id, f"{worker_id}.{old_task}", 99_999)
        store.write_segment(path, {"obs": np.zeros((4, 4), np.float32)})
        late = SegmentRef(path=path, rows=4, env_steps=4, policy_version=0)
        with pytest.raises(ApiError) as refused:
            cluster.data.insert_segments(job_id, [late], task_id=old_task)
        assert refused.value.status == 409 and refused.value.code == "task_not_active"
        assert cluster.client.job(job_id).env_steps >= env_steps
        os.kill(victim.process.pid, signal.SIGCONT)
        # it is told to register again and does; its old task is not given back
        wait_until(
            lambda: any(
                w.url == url and w.worker_id != worker_id for w in cluster.client.workers()
            ),
            30,
            "re-registration",
        )
        finish(cluster, job_id)


def test_learner_killed_resumes_from_checkpoint(tmp_path):
    with fast_lease_cluster(tmp_path) as cluster:
        job_id = cluster.client.submit_job(CONFIG).job_id
        wait_until(lambda: cluster.client.job(job_id).policy_version >= 5, 60, "a few versions")
        learner = cluster.learners[0]
        old_id = next(w.worker_id for w in cluster.client.workers() if w.role == "learner")
        before = cluster.client.job(job_id)
        (feeder,) = child_processes(learner.process.pid, "services.learner.feeder")
        os.kill(learner.process.pid, signal.SIGKILL)
        learner.wait(5)
        killed_at = time.monotonic()
        # its feeder process hears the learner's end of their socket close, and ends
        wait_until(lambda: not running(feeder), 10, "the killed learner's feeder to end")
        cluster.supervise()

        def resumed():
            for worker in cluster.client.workers():
                for task_id, progress in worker.progress.items():
                    # (its first report may come before its first train iteration)
                    if (
                        task_id.startswith("learn-")
                        and worker.worker_id != old_id
                        and "train_iter" in progress
                    ):
                        return progress
            return None

        progress = wait_until(resumed, 60, "the restarted learner's progress")
        print(f"learner training again {time.monotonic() - killed_at:.1f}s after the kill")
        # it went on from the checkpoint and the newest published version, not from 0
        assert progress["train_iter"] >= before.train_iters - 50
        after = cluster.client.job(job_id)
        assert after.train_iters >= before.train_iters
        wait_until(
            lambda: cluster.client.job(job_id).policy_version > before.policy_version,
            60,
            "a newer version",
        )
        finish(cluster, job_id)


def test_coordinator_killed_and_restarted_resumes_the_job(tmp_path):
    with fast_lease_cluster(tmp_path) as cluster:
        job_id = cluster.client.submit_job(CONFIG).job_id
        wait_until(lambda: cluster.client.job(job_id).env_steps > 1000, 60, "collection")
        time.sleep(1.2)  # at least one snapshot of this state
        before_status = cluster.client.job(job_id)
        before_buffer = cluster.client.buffer_stats(job_id)
        os.kill(cluster.coordinator.process.pid, signal.SIGKILL)
        cluster.coordinator.wait(5)
        restarted_at = time.monotonic()
        cluster.supervise()
        cluster.wait_ready(30)
        status = cluster.client.job(job_id)
        buffer = cluster.client.buffer_stats(job_id)
        # counters and buffer came back; every acknowledged item is still indexed
        assert status.phase == "running"
        assert status.env_steps >= before_status.env_steps
        assert buffer["inserts"] >= before_buffer["inserts"], (buffer, before_buffer)
        assert buffer["size"] >= min(before_buffer["size"], buffer["capacity"])
        assert status.policy_version >= before_status.policy_version
        lost = max(0, before_buffer["inserts"] - buffer["inserts"])
        # workers register again by themselves and the job moves on
        wait_until(lambda: cluster.client.job(job_id).env_steps > status.env_steps, 60, "new data")
        print(
            f"coordinator resumed collecting {time.monotonic() - restarted_at:.1f}s after "
            f"its restart; acknowledged items lost: {lost}"
        )
        assert lost == 0
        finish(cluster, job_id)


def test_duplicate_insert_counts_once_and_a_new_collector_gets_work(tmp_path):
    with fast_lease_cluster(tmp_path) as cluster:
        job_id = cluster.client.submit_job(CONFIG).job_id
        wait_until(lambda: cluster.client.job(job_id).env_steps > 0, 60, "collection")
        # scaling out mid-job: the new collector is given a collect task at once
        added = cluster.add_collector()
        wait_until(
            lambda: any(
                url == added.url and "collect" in k
                for _, url, k in tasks_by_role(cluster)["collector"]
            ),
            60,
            "work for the added collector",
        )
        # the same insert twice counts once
        store = SharedStore(cluster.shared_dir)
        path = store.segment_path(job_id, "by-hand", 0)
        store.write_segment(path, {"obs": np.zeros((8, 4), np.float32)})
        ref = SegmentRef(path=path, rows=8, env_steps=8, policy_version=0)
        first = cluster.data.insert_segments(job_id, [ref], timeout_s=10)
        second = cluster.data.insert_segments(job_id, [ref], timeout_s=10)
        assert (first.accepted, second.accepted, second.duplicates) == (1, 0, 1)
        assert second.env_steps == first.env_steps or second.env_steps > first.env_steps
        finish(cluster, job_id)
