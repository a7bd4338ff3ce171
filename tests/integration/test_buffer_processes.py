"""Each job's buffer in a process of its own (services/coordinator/buffers.py), with
real processes on 127.0.0.1: collectors and learners go to it directly with their
task's credential; killed with SIGKILL mid-job, it is restarted from its snapshot and
the job ends with nothing acknowledged lost; it dies with its coordinator and a
restarted coordinator starts it again."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from types import SimpleNamespace

import pytest
import requests
import yaml

from common.config import deep_merge
from common.errors import ApiError
from common.messages import SegmentRef
from common.storage import SharedStore
from drover.local import LocalCluster
from services.buffer.table import shard_of
from tests.coordinator_app import write_segment
from tests.helpers import (
    EXAMPLES,
    buffer_processes,
    child_processes,
    running,
    wait_for_end,
    wait_until,
)

pytestmark = [pytest.mark.processes, pytest.mark.chaos]

DEADLINE_S = 180
#: DQN with 1-step transitions (a segment's rows are its env steps), no goal.
DQN = deep_merge(
    yaml.safe_load((EXAMPLES / "cartpole_dqn.yaml").read_text()),
    {
        "env": {"stop_value": None, "collector_env_num": 4, "n_evaluator_episode": 2},
        "policy": {"nstep": 1, "other": {"replay_buffer": {"min_size_to_sample": 200}}},
        "system": {"max_env_step": 6000},
    },
)


def buffer_pids(cluster) -> list[int]:
    """The processes serving a job's buffer (not the spare one waiting for a job)."""
    return list(buffer_processes(cluster.coordinator.process.pid).values())


def assert_nothing_lost(cluster, job_id):
    status = cluster.client.job(job_id)
    buffer = cluster.client.buffer_stats(job_id)
    assert status.phase == "succeeded", status
    assert buffer["inserts"] == status.env_steps, (buffer, status)


def test_a_buffer_process_killed_mid_job_comes_back_and_loses_nothing(tmp_path):
    with LocalCluster(tmp_path / "run", num_collectors=2) as cluster:
        cluster.wait_for_workers()
        job_id = cluster.client.submit_job(DQN).job_id
        wait_until(lambda: cluster.client.job(job_id).env_steps > 1500, 60, "collection")
        (pid,) = buffer_pids(cluster)
        os.kill(pid, signal.SIGKILL)
        wait_until(
            lambda: buffer_pids(cluster) and buffer_pids(cluster) != [pid],
            30,
            "the buffer process restarted",
        )
        wait_for_end(cluster, job_id, DEADLINE_S)
        assert_nothing_lost(cluster, job_id)
        assert cluster.client.job(job_id).train_iters > 0
        log = cluster.coordinator.log_path.read_text()
        assert "exited (code -9, 1 times in 60 s); restarting it in 0.0 s" in log
        # The job ended: its process went with it.
        wait_until(lambda: not buffer_pids(cluster), 30, "the ended job's buffer process gone")


def test_data_goes_to_the_buffer_process_and_an_operator_reaches_it_through_the_coordinator(
    tmp_path,
):
    with LocalCluster(tmp_path / "run", num_collectors=1) as cluster:
        cluster.wait_for_workers()
        job_id = cluster.client.submit_job(
            deep_merge(DQN, {"system": {"max_env_step": None}})
        ).job_id
        wait_until(lambda: cluster.client.job(job_id).env_steps > 500, 60, "collection")
        # An operator's sample through the coordinator is passed on to it, answered there.
        resp = requests.post(
            f"{cluster.coordinator_url}/api/v1/jobs/{job_id}/samples",
            json={"batch_size": 4, "timeout_s": 1},
            headers={"Authorization": f"Bearer {cluster.token}"},
            timeout=10,
        )
        assert resp.status_code == 200 and len(resp.json()["batches"][0]["keys"]) == 4
        stats = cluster.client.buffer_stats(job_id)
        assert stats["size"] > 0
        # A worker is refused there: acting for another worker's task is a 403 first;
        # for a task of its own, its task's data access says where to send (409).
        (collect,) = [t for w in cluster.client.workers() for t in w.task_ids if "collect" in t]
        other = requests.post(
            f"{cluster.coordinator_url}/api/v1/workers",
            json={"role": "collector", "url": "http://127.0.0.1:9", "slave_token": "s" * 32},
            headers={"Authorization": f"Bearer {cluster.registration_token}"},
            timeout=10,
        ).json()
        as_other = {"Authorization": f"Bearer {other['credential']}"}
        insert = f"{cluster.coordinator_url}/api/v1/jobs/{job_id}/segments"
        for task_id, status in ((collect, 403), ("collect-notmine", 409)):
            body = {"segments": [], "task_id": task_id}
            resp = requests.post(insert, json=body, headers=as_other, timeout=10)
            assert resp.status_code == status, resp.json()
        cluster.client.stop_job(job_id)


def test_an_operators_first_insert_into_a_new_jobs_buffer_process_is_answered_as_accepted(
    tmp_path,
):
    # Written as the job's buffer process starts: its first sweep indexes the file while
    # the forwarded insert waits to connect. The insert is the file's own, not a
    # duplicate of itself; a retry of it is one.
    with LocalCluster(tmp_path / "run", num_collectors=0, num_learners=0) as cluster:
        job_id = cluster.client.submit_job(
            deep_merge(DQN, {"system": {"max_env_step": None}})
        ).job_id
        core = SimpleNamespace(store=SharedStore(cluster.shared_dir))
        for seq in range(3):
            ref = SegmentRef(**write_segment(core, job_id, seq, worker="operator", header=True))
            first = cluster.data.insert_segments(job_id, [ref])
            assert (first.accepted, first.duplicates) == (1, 0), (seq, first)
            again = cluster.data.insert_segments(job_id, [ref])
            assert (again.accepted, again.duplicates) == (0, 1), (seq, again)
        assert cluster.client.buffer_stats(job_id)["inserts"] == 30
        cluster.client.stop_job(job_id)


def test_inserts_passed_on_are_bounded_as_those_served_in_the_coordinator(tmp_path):
    # One insert at a time (DROVER_MAX_CONCURRENT_INSERTS=1): one that waits in the job's
    # rate limiter holds it, and another is answered 429 busy at once, not queued on a
    # coordinator thread.
    limited = {"samples_per_insert": 1.0, "min_size_to_sample": 10}
    config = deep_merge(
        DQN,
        {"system": {"max_env_step": None}, "policy": {"other": {"replay_buffer": limited}}},
    )
    env = {"DROVER_MAX_CONCURRENT_INSERTS": "1"}
    with LocalCluster(tmp_path / "run", num_collectors=0, num_learners=0, extra_env=env) as cluster:
        job_id = cluster.client.submit_job(config).job_id
        core = SimpleNamespace(store=SharedStore(cluster.shared_dir))

        def ref(seq):
            segment = write_segment(core, job_id, seq, rows=200, worker="operator", header=True)
            return SegmentRef(**segment)

        seq = 0
        with pytest.raises(ApiError) as ahead:  # until the learner (none) falls behind
            for seq in range(20):
                cluster.data.insert_segments(job_id, [ref(seq)])
        assert ahead.value.code == "rate_limited", ahead.value

        def insert_that_waits():
            with contextlib.suppress(ApiError):  # rate_limited, after its 5 s
                cluster.data.insert_segments(job_id, [ref(seq + 1)], timeout_s=5.0)

        waits = threading.Thread(target=insert_that_waits)
        waits.start()
        wait_until(
            lambda: cluster.client.buffer_stats(job_id)["waiting_inserters"] == 1,
            10,
            "the insert to wait in the rate limiter",
        )
        started = time.monotonic()
        with pytest.raises(ApiError) as busy:
            cluster.data.insert_segments(job_id, [ref(seq + 2)])
        assert busy.value.status == 429 and busy.value.code == "busy", busy.value
        assert time.monotonic() - started < 2.0
        waits.join(10)
        cluster.client.stop_job(job_id)


def test_a_job_whose_buffer_process_is_frozen_stops_within_the_ends_patience(tmp_path):
    # The request that stops a job waits for its end to be recorded, and for the buffer
    # process's last figures: END_PATIENCE_S (5 s) for all of that together, then the
    # process is killed, not waited for again (it waited 10 s for figures, 60 s for a
    # release and 30 s for an exit before, past the client's 10 s).
    with LocalCluster(tmp_path / "run", num_collectors=0, num_learners=0) as cluster:
        job_id = cluster.client.submit_job(
            deep_merge(DQN, {"system": {"max_env_step": None}})
        ).job_id
        wait_until(lambda: buffer_pids(cluster), 30, "the job's buffer process")
        wait_until(lambda: cluster.client.buffer_stats(job_id), 30, "its first answer")
        (pid,) = buffer_pids(cluster)
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            cluster.client.stop_job(job_id)
            took_s = time.monotonic() - started
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        status = cluster.client.job(job_id)
        assert status.phase == "stopped" and took_s < 9.0, (status, took_s)
        wait_until(lambda: not running(pid), 15, "the frozen process gone")
        assert "buffer's final statistics are lost" in cluster.coordinator.log_path.read_text()


def test_buffer_processes_die_with_their_coordinator_and_come_back_with_it(tmp_path):
    with LocalCluster(tmp_path / "run", num_collectors=2) as cluster:
        cluster.wait_for_workers()
        job_id = cluster.client.submit_job(DQN).job_id
        wait_until(lambda: cluster.client.job(job_id).env_steps > 1500, 60, "collection")
        (pid,) = buffer_pids(cluster)
        before = cluster.client.job(job_id).env_steps
        os.kill(cluster.coordinator.process.pid, signal.SIGKILL)
        cluster.coordinator.wait(10)
        wait_until(lambda: not running(pid), 10, "the buffer process dying with it")
        cluster.supervise()
        cluster.wait_ready(60)
        wait_until(lambda: buffer_pids(cluster), 30, "a new buffer process")
        assert cluster.client.job(job_id).env_steps >= before
        wait_for_end(cluster, job_id, DEADLINE_S)
        assert_nothing_lost(cluster, job_id)
        time.sleep(0)


def shard_pids(cluster, job_id) -> list[int]:
    """The processes serving a job's buffer shards (each works in the job's folder)."""
    pids = []
    for pid in child_processes(cluster.coordinator.process.pid, "services.buffer"):
        try:
            if os.readlink(f"/proc/{pid}/cwd").endswith(f"/{job_id}"):
                pids.append(pid)
        except OSError:
            continue
    return sorted(pids)


def kill_and_wait_for_restart(cluster, job_id, pid):
    """SIGKILL one of a job's two shard processes; wait for the coordinator's new one."""
    os.kill(pid, signal.SIGKILL)
    wait_until(
        lambda: len(shard_pids(cluster, job_id)) == 2 and pid not in shard_pids(cluster, job_id),
        30,
        "the shard restarted",
    )


def test_a_buffer_split_over_two_shards_trains_and_rides_through_a_shard_kill(tmp_path):
    """`replay_buffer.shards: 2`: two processes, each indexing its half of the segments
    (and snapshotting into its own folder); the learner draws over both, its
    priorities go back to the shard of each key; one shard killed mid-job comes back
    and nothing acknowledged is lost."""
    sharded = deep_merge(DQN, {"policy": {"other": {"replay_buffer": {"shards": 2}}}})
    with LocalCluster(tmp_path / "run", num_collectors=2) as cluster:
        cluster.wait_for_workers()
        job_id = cluster.client.submit_job(sharded).job_id
        wait_until(lambda: cluster.client.job(job_id).env_steps > 1500, 60, "collection")
        pids = shard_pids(cluster, job_id)
        assert len(pids) == 2, pids
        wait_until(lambda: cluster.client.job(job_id).train_iters > 0, 60, "training")
        # An operator's tool, through the coordinator, draws over both shards and
        # sends priorities to the shard of each key. (A shard whose rate limiter holds
        # the learner back says a mass of 0 and gives no part of a draw: a few draws.)
        seen, keys = set(), []

        def both_shards_drawn():
            reply = cluster.data.sample(job_id, batch_size=64, num_batches=1, timeout_s=5)
            keys[:] = [k for batch in reply.batches for k in batch.keys]
            assert len(keys) == 64
            seen.update(shard_of(keys, 2).tolist())
            return seen == {0, 1}

        wait_until(both_shards_drawn, 30, "an operator's draws from both shards")
        assert cluster.data.update_priorities(job_id, keys, [1.0] * len(keys)) > 0
        # Holds are a learner's, kept by its own client of the shards: not here.
        with pytest.raises(ApiError, match="task_id"):
            cluster.data.sample(job_id, batch_size=8, num_batches=1, timeout_s=1, task_id="learn-x")
        kill_and_wait_for_restart(cluster, job_id, pids[1])
        # Each shard indexes its share of the segments: read each one's own stats (at
        # the addresses the coordinator logged) until the job ends.
        logged = re.search(
            rf"job {job_id}: its buffer runs in 2 process\(es\) of its own at (\S+), (\S+)",
            cluster.coordinator.log_path.read_text(),
        )
        assert logged, "the shards' addresses"
        inserts = [0, 0]

        def ended():
            for k, url in enumerate(logged.groups()):
                with contextlib.suppress(requests.RequestException, ValueError):
                    stats = requests.get(
                        f"{url}/api/v1/jobs/{job_id}/buffer",
                        headers={"Authorization": f"Bearer {cluster.token}"},
                        timeout=5,
                    ).json()
                    inserts[k] = max(inserts[k], stats.get("inserts", 0))
            return cluster.client.job(job_id).phase not in ("running", "queued")

        wait_until(ended, DEADLINE_S, "the job's end", interval_s=0.5)
        assert min(inserts) > 0, inserts
        wait_for_end(cluster, job_id, DEADLINE_S)
        assert_nothing_lost(cluster, job_id)
        buffer = cluster.client.buffer_stats(job_id)
        assert buffer["capacity"] == DQN["policy"]["other"]["replay_buffer"].get(
            "replay_buffer_size", 20000
        )
        # The rate limiter kept the job's ratio over both shards (16 samples an insert
        # past the first 200 items, give or take its error buffer).
        ratio = buffer["samples"] / buffer["inserts"]
        assert 12 <= ratio <= 17, buffer["limiter"]
        assert "shard 1)'s process exited (code -9, 1 times in 60 s); restarting it" in (
            cluster.coordinator.log_path.read_text()
        )


def test_a_sync_job_over_two_fifo_shards_trains_on_whole_rounds_through_a_shard_kill(tmp_path):
    """PPO's sync rounds from a fifo buffer split over 2 shards: each round's 2048
    items are drawn from both at once (each hands out its oldest, held for the learn
    task until acknowledged), every round trains on items of its own version; one
    shard killed mid-job comes back, and the job ends with nothing acknowledged lost."""
    ppo = deep_merge(
        yaml.safe_load((EXAMPLES / "cartpole_ppo.yaml").read_text()),
        {
            "env": {"stop_value": None, "n_evaluator_episode": 2},
            "policy": {
                "learn": {"epoch_per_collect": 2},
                "other": {"replay_buffer": {"shards": 2}},
            },
            "system": {"max_env_step": 8 * 2048},
        },
    )
    with LocalCluster(tmp_path / "run", num_collectors=2) as cluster:
        cluster.wait_for_workers()
        job_id = cluster.client.submit_job(ppo).job_id
        wait_until(lambda: cluster.client.job(job_id).train_iters > 0, 90, "a first round")
        buffer = cluster.client.buffer_stats(job_id)
        # Before the kill: every item drawn had its round's version.
        histogram = buffer["sampled_lag_histogram"]
        assert histogram[0] == buffer["samples"] > 0 and sum(histogram[1:]) == 0, buffer
        pids = shard_pids(cluster, job_id)
        assert len(pids) == 2, pids
        kill_and_wait_for_restart(cluster, job_id, pids[1])
        wait_for_end(cluster, job_id, DEADLINE_S)
        assert_nothing_lost(cluster, job_id)
        status = cluster.client.job(job_id)
        assert status.env_steps >= 8 * 2048 and status.train_iters > 0
        # The learner acknowledged what it trained on, on both shards: no more is held
        # than the round it trained last.
        buffer = cluster.client.buffer_stats(job_id)
        assert buffer["held_items"] <= 2048, buffer
        assert buffer["evictions"].get("max_use", 0) >= buffer["samples"] - 2 * 2048, buffer


def test_a_buffer_process_that_keeps_dying_fails_its_job_and_a_frozen_one_is_shown(tmp_path):
    """Supervised: a job's buffer process frozen (SIGSTOP) is named in its job's status
    while another job's counts go on (each process has a watcher of its own); killed
    more than DROVER_BUFFER_MAX_RESTARTS times in the window, restarted after a
    growing backoff, it is not started again and its job fails naming it."""
    # A collector and a learner each: both jobs train side by side.
    endless = deep_merge(DQN, {"system": {"max_env_step": 10**7, "collector_num": 1}})
    with LocalCluster(
        tmp_path / "run",
        num_collectors=2,
        num_learners=2,
        extra_env={"DROVER_BUFFER_MAX_RESTARTS": "3"},
    ) as cluster:
        cluster.wait_for_workers()
        doomed = cluster.client.submit_job(endless).job_id
        other = cluster.client.submit_job(endless).job_id
        pids = lambda: buffer_processes(cluster.coordinator.process.pid)  # noqa: E731
        wait_until(lambda: len(pids()) == 2, 60, "both jobs' buffer processes")
        wait_until(lambda: cluster.client.job(other).env_steps > 0, 60, "the other's steps")
        frozen = pids()[doomed]
        os.kill(frozen, signal.SIGSTOP)
        try:
            wait_until(
                lambda: "has not answered for" in cluster.client.job(doomed).reason,
                15,
                "the frozen buffer process in its job's status",
            )
            before = cluster.client.job(other).env_steps
            wait_until(
                lambda: cluster.client.job(other).env_steps > before + 100,
                30,
                "the other job's env steps counted while one buffer process is frozen",
            )
        finally:
            os.kill(frozen, signal.SIGCONT)
        killed = set()
        deadline = time.monotonic() + 90
        while cluster.client.job(doomed).phase == "running" and time.monotonic() < deadline:
            pid = pids().get(doomed)
            if pid is not None and pid not in killed:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            time.sleep(0.1)
        status = cluster.client.job(doomed)
        assert status.phase == "failed", status
        assert "buffer process exited 4 times" in status.reason, status.reason
        assert "DROVER_BUFFER_MAX_RESTARTS 3" in status.reason
        assert len(killed) == 4
        assert cluster.client.job(other).phase == "running"
        log = cluster.coordinator.log_path.read_text()
        # The third exit in the window waited its backoff (0.5 s doubled once, jittered).
        assert re.search(
            r"exited \(code -9, 3 times in 60 s\); restarting it in (0\.[5-9]|1\.0) s", log
        )


def test_a_job_runs_on_through_many_credential_lifetimes(tmp_path):
    """Task credentials expire (here after 3 s): each heartbeat brings a fresh one to the
    collectors and to the learner's feeder process, so collection and training go on
    far past a credential's life, with no task failed and no request refused as stale."""
    endless = deep_merge(DQN, {"system": {"max_env_step": 10**8}})
    with LocalCluster(
        tmp_path / "run", num_collectors=2, extra_env={"DROVER_CREDENTIAL_TTL_S": "3"}
    ) as cluster:
        cluster.wait_for_workers()
        job_id = cluster.client.submit_job(endless).job_id
        wait_until(lambda: cluster.client.job(job_id).train_iters > 0, 60, "training")
        time.sleep(8)  # past two credential lifetimes
        before = cluster.client.job(job_id)
        time.sleep(4)
        after = cluster.client.job(job_id)
        assert after.env_steps > before.env_steps and after.train_iters > before.train_iters
        assert after.task_failures == 0 and after.tasks_reassigned == 0, after
        logs = "".join(p.read_text() for p in cluster.log_dir.glob("*.log"))
        assert "credential_stale" not in logs
