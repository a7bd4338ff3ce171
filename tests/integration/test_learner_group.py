"""A learner group of 2 ranks (torchrun, gloo on CPU) through the real services: it
learns CartPole with DQN and PPO, shows itself as one learner with its ranks, and
survives a rank killed (SIGKILL) and a rank hung (SIGSTOP past the collective
timeout): torchrun restarts the group, the job succeeds, policy versions strictly
increase and `train_iter` never goes back.

Every wait has a deadline; all traffic stays on 127.0.0.1.
"""

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from common.config import deep_merge
from drover.local import LocalCluster, free_port
from jobconfig import load_config_file
from tests.helpers import wait_for_end, wait_until

pytestmark = [pytest.mark.processes, pytest.mark.torchrun]

ROOT = Path(__file__).resolve().parents[2]
FAST = {
    "DROVER_HEARTBEAT_INTERVAL_S": "0.5",
    "DROVER_LEASE_TIMEOUT_S": "3",
    "DROVER_SCHEDULER_PERIOD_S": "0.2",
    # A hung rank is noticed after this long.
    "DROVER_COLLECTIVE_TIMEOUT_S": "8",
}


def group_cluster(tmp_path, **kwargs):
    return LocalCluster(
        tmp_path / "run", num_collectors=2, learner_ranks=2, extra_env=FAST, **kwargs
    )


def rank_pids(agent_pid: int) -> dict[int, int]:
    """The pids of the ranks torchrun (`agent_pid`) runs now, by rank (from /proc)."""
    ranks = {}
    for task in Path(f"/proc/{agent_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            except OSError:
                continue  # exited meanwhile
            env = dict(entry.split(b"=", 1) for entry in environ if b"=" in entry)
            if b"RANK" in env:
                ranks[int(env[b"RANK"])] = int(child)
    return ranks


class PolicyWatch:
    """The (version, train_iter) of the job's newest policy, polled in the background:
    what collectors and evaluators see of the learner over the whole job."""

    def __init__(self, cluster, job_id):
        self.seen: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(cluster, job_id), daemon=True)
        self._thread.start()

    def _poll(self, cluster, job_id):
        while not self._stop.wait(0.1):
            try:
                ref = cluster.client.latest_policy(job_id)
            except Exception:  # noqa: BLE001 - a poll lost while the learner restarts
                continue
            if ref is not None and (not self.seen or self.seen[-1][0] != ref.version):
                self.seen.append((ref.version, ref.train_iter))

    def stop(self):
        self._stop.set()
        self._thread.join(5)
        return self.seen


@pytest.mark.learning
def test_dqn_learns_cartpole_on_a_group_seen_as_one_learner(tmp_path):
    config = load_config_file(ROOT / "examples" / "cartpole_dqn.yaml")
    with group_cluster(tmp_path) as cluster:
        cluster.wait_for_workers(120)
        (learner,) = [w for w in cluster.client.workers() if w.role == "learner"]
        assert learner.resources["learner_ranks"] == 2
        assert learner.resources["rank_devices"] == "cpu,cpu"
        job_id = cluster.client.submit_job(config).job_id

        def group_training():
            (summary, *_) = cluster.client.job(job_id).learners or [None]
            return summary if summary and len(summary.rank_samples_per_s) == 2 else None

        summary = wait_until(group_training, 60, "the group's per-rank throughput")
        assert summary.world_size == 2 and summary.rank_devices == ["cpu", "cpu"]
        assert all(rate > 0 for rate in summary.rank_samples_per_s)
        workers = {w.role: w for w in cluster.client.workers()}
        progress = next(iter(workers["learner"].progress.values()))
        assert progress["world_size"] == 2 and progress["rank_1_samples_per_s"] > 0
        status = wait_for_end(cluster, job_id, 180)
        assert status.phase == "succeeded", status
        assert status.last_eval.return_mean >= 195


@pytest.mark.learning
def test_ppo_reaches_475_on_a_group(tmp_path):
    config = load_config_file(ROOT / "examples" / "cartpole_ppo.yaml")
    with group_cluster(tmp_path) as cluster:
        job_id = cluster.client.submit_job(config).job_id
        status = wait_for_end(cluster, job_id, 300)
        assert status.phase == "succeeded", status
        assert status.last_eval.return_mean >= 475
        buffer = cluster.client.buffer_stats(job_id)
        # Still on-policy: every sampled item was collected by the version trained.
        assert sum(buffer["sampled_lag_histogram"][1:]) == 0


@pytest.mark.chaos
def test_a_killed_and_a_hung_rank_restart_the_group_and_the_job_succeeds(tmp_path):
    config = deep_merge(
        load_config_file(ROOT / "examples" / "cartpole_dqn.yaml"),
        # A train-iteration budget instead of a return goal: the job's end depends on
        # the group surviving, not on how quickly DQN learns after each restart.
        {
            "env": {"stop_value": None},
            "policy": {"learn": {"checkpoint_every_iters": 100}},
            "system": {"max_train_iter": 1500},
        },
    )
    with group_cluster(tmp_path) as cluster:
        agent = cluster.learners[0].process.pid
        job_id = cluster.client.submit_job(config).job_id
        watch = PolicyWatch(cluster, job_id)
        wait_until(lambda: cluster.client.job(job_id).train_iters >= 100, 90, "training")

        killed = rank_pids(agent)[1]
        os.kill(killed, signal.SIGKILL)
        restarted = wait_until(
            lambda: (pids := rank_pids(agent)).get(1) not in (None, killed) and pids,
            60,
            "torchrun to restart the group",
        )
        after_kill = cluster.client.job(job_id).train_iters
        wait_until(
            lambda: cluster.client.job(job_id).train_iters >= after_kill + 100,
            90,
            lambda: (
                f"the restarted group to train: {cluster.client.job(job_id)}, "
                f"{[w for w in cluster.client.workers() if w.role == 'learner']}"
            ),
        )

        hung = restarted[1]
        os.kill(hung, signal.SIGSTOP)
        try:
            # Rank 0's next collective times out (8 s), the group exits, and torchrun
            # stops the hung rank (SIGTERM, then SIGKILL after 30 s) and restarts it.
            wait_until(
                lambda: rank_pids(agent).get(1) not in (None, hung),
                90,
                "the hung rank to be replaced",
            )
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(hung, signal.SIGCONT)
        status = wait_for_end(cluster, job_id, 240)
        seen = watch.stop()
        assert status.phase == "succeeded", status
        assert cluster.learners[0].alive(), "torchrun gave up on the group"
        versions = [v for v, _ in seen]
        iters = [t for _, t in seen]
        assert versions == sorted(set(versions)), f"versions not strictly increasing: {seen}"
        assert iters == sorted(iters), f"train_iter went back: {seen}"
        log = (cluster.log_dir / "learner-0.log").read_text()
        assert log.count("learner group broken") >= 2


@pytest.mark.learning
def test_two_torchrun_nodes_form_one_group_through_the_c10d_rendezvous(tmp_path):
    """What several machines do: one torchrun per node, joined by the rendezvous flags
    (here two "nodes" on 127.0.0.1, each with its own port for rank 0 to serve on)."""
    config = load_config_file(ROOT / "examples" / "cartpole_dqn.yaml")
    with LocalCluster(tmp_path / "run", num_collectors=2, num_learners=0) as cluster:
        rendezvous = free_port()
        nodes = []
        try:
            for node in range(2):
                env = {**cluster.collectors[0].env, "DROVER_PORT": str(free_port())}
                env.pop("DROVER_ADVERTISE_URL")  # whichever node rank 0 lands on
                command = [sys.executable, "-m", "torch.distributed.run"]
                command += ["--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "0"]
                command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{rendezvous}"]
                command += ["--rdzv-id", "two-nodes", "-m", "services.learner"]
                log = open(cluster.log_dir / f"node-{node}.log", "wb")  # noqa: SIM115
                nodes.append(
                    subprocess.Popen(command, env=env, cwd=cluster.run_dir, stdout=log, stderr=log)
                )
            job_id = cluster.client.submit_job(config).job_id
            status = wait_for_end(cluster, job_id, 180)
            assert status.phase == "succeeded", status
            (learner,) = [w for w in cluster.client.workers() if w.role == "learner"]
            assert learner.resources["learner_ranks"] == 2
        finally:
            for process in nodes:
                process.terminate()
            for process in nodes:
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
