"""Many jobs on one coordinator (services/coordinator/sharing.py): workers shared by
weight, moved by releasing tasks at a safe point, priorities, a sync round's collectors
given whole, learners taken in turns, the queue, what each job is told, and all of it
across a restart. Workers are simulated: each pass's assignments are confirmed, and a
released task ends (complete) at once unless a test holds it."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from common.messages import Heartbeat, TaskProgress, WorkerRegistration
from common.storage import SharedStore
from services.coordinator.app import create_app
from services.coordinator.core import CoordinatorLimits
from services.coordinator.settings import CoordinatorSettings
from tests.buffer_hosts import make_coordinator
from tests.coordinator_app import AUTH, CONFIG, SLAVE_TOKEN, TOKEN, get, post, submit, write_segment

PPO = {
    "env": {"env_id": "CartPole-v1"},
    "policy": {"type": "ppo", "collect": {"n_sample": 64}},
    "system": {"workflow": "sync", "collector_num": 2},
}


def dqn(**system):
    return {**CONFIG, "system": system}


class Cluster:
    """A coordinator app with a fake clock and simulated workers."""

    def __init__(self, tmp_path, **limits):
        self.now = 0.0
        self.tmp_path = tmp_path
        self.limits = CoordinatorLimits(lease_timeout_s=1e9, **limits)
        self.core = self._coordinator()
        self.workers: dict[str, str] = {}  # worker id -> role
        #: Released tasks the workers do not end (a test ends them).
        self.hold_releases = False
        self.released: list[str] = []
        self.cancelled: list[str] = []

    def _coordinator(self):
        core = make_coordinator(SharedStore(self.tmp_path), self.limits, clock=lambda: self.now)
        app = create_app(CoordinatorSettings(shared_dir=self.tmp_path, token=TOKEN), core=core)
        self.client = app.test_client()
        return core

    def restart(self):
        self.core.close()
        self.core = self._coordinator()
        self.core.restore_jobs()
        self.workers.clear()

    def add(self, role, count=1):
        for _ in range(count):
            reg = self.core.register_worker(
                WorkerRegistration(
                    role=role,
                    url=f"http://127.0.0.1:{9000 + len(self.workers)}",
                    slave_token=SLAVE_TOKEN,
                )
            )
            self.workers[reg.worker_id] = role

    def submit(self, config):
        return submit(self.client, config)

    def step(self, seconds=0.5):
        """The clock moves on; one pass; its calls answered as workers would."""
        self.now += seconds
        for dispatch in self.core.plan():
            if dispatch.task is not None:
                self.core.dispatched(dispatch.task.task_id)
            elif dispatch.release_task_id is not None:
                self.released.append(dispatch.release_task_id)
                if not self.hold_releases:
                    self.core.complete_task(dispatch.release_task_id, {})
            elif dispatch.cancel_task_id is not None:
                self.cancelled.append(dispatch.cancel_task_id)

    def run(self, seconds, step_s=0.5):
        for _ in range(round(seconds / step_s)):
            self.step(step_s)

    def held(self, job_id, kind="collect"):
        return sum(t.job_id == job_id and t.kind == kind for t in self.core.tasks.values())

    def status(self, job_id):
        return get(self.client, f"/api/v1/jobs/{job_id}").json


def test_three_equal_jobs_share_four_collectors_and_each_gets_a_learner(tmp_path):
    cluster = Cluster(tmp_path)
    cluster.add("collector", 4)
    cluster.add("learner", 3)
    jobs = [cluster.submit(dqn()) for _ in range(3)]
    cluster.step()
    assert sorted(cluster.held(j) for j in jobs) == [1, 1, 2]
    assert all(cluster.held(j, "learn") == 1 for j in jobs)
    seconds = collections.Counter()
    for _ in range(120):
        cluster.step()
        for job in jobs:
            seconds[job] += cluster.held(job) * 0.5
            assert cluster.held(job) >= 1  # none ever goes without
    total = sum(seconds.values())
    assert all(seconds[j] / total == pytest.approx(1 / 3, rel=0.1) for j in jobs)
    # The odd collector moved by releases, each a task ended as preempted.
    preempted = sum(cluster.status(j)["tasks_preempted"] for j in jobs)
    assert preempted == len(cluster.released) > 0
    assert all(cluster.core.task_state(t) == "preempted" for t in cluster.released)
    share = cluster.status(jobs[0])["collector_share"]
    assert share["owed"] == pytest.approx(4 / 3, abs=0.01) and 1 <= share["held"] <= 2
    assert share["owed_s"] == pytest.approx(4 / 3 * 60.5, rel=0.02)


def test_weights_divide_the_collectors(tmp_path):
    cluster = Cluster(tmp_path)
    cluster.add("collector", 4)
    cluster.add("learner", 3)
    a, b, c = (cluster.submit(dqn(share=w)) for w in (1, 1, 2))
    cluster.run(5)
    assert [cluster.held(j) for j in (a, b, c)] == [1, 1, 2]
    assert cluster.status(c)["share"] == 2 and cluster.status(c)["collector_share"]["owed"] == 2


def test_a_released_collector_keeps_inserting_until_it_ends_then_goes_to_the_new_job(tmp_path):
    cluster = Cluster(tmp_path)
    cluster.add("collector", 2)
    cluster.add("learner", 2)
    first = cluster.submit(dqn())
    cluster.step()
    assert cluster.held(first) == 2
    cluster.hold_releases = True
    second = cluster.submit(dqn())
    cluster.step()
    (released,) = cluster.released
    task = cluster.core.tasks[released]
    # The worker is told at its heartbeats too, and its last segment still goes in.
    beat = cluster.core.heartbeat(
        task.worker_id, Heartbeat(tasks=[TaskProgress(task_id=released, state="running")])
    )
    assert beat.release == [released] and beat.cancel == []
    ref = write_segment(cluster.core, first, 0, worker=task.worker_id)
    resp = post(
        cluster.client,
        f"/api/v1/jobs/{first}/segments",
        {"segments": [ref], "task_id": released},
    )
    assert resp.status_code == 200 and resp.json["accepted"] == 1
    assert cluster.held(second) == 0  # its collector is still busy
    cluster.core.complete_task(released, {})
    cluster.step()
    assert cluster.held(first) == 1 and cluster.held(second) == 1
    assert cluster.core.task_state(released) == "preempted"


def test_a_release_not_ended_within_its_grace_is_cancelled(tmp_path):
    cluster = Cluster(tmp_path, release_grace_s=10.0)
    cluster.add("collector", 2)
    cluster.add("learner", 2)
    first = cluster.submit(dqn())
    cluster.step()
    cluster.hold_releases = True
    second = cluster.submit(dqn())
    cluster.step()
    (released,) = cluster.released
    cluster.run(9)
    assert cluster.core.task_state(released) == "running" and not cluster.cancelled
    cluster.run(2)
    assert cluster.cancelled == [released]
    assert cluster.core.task_state(released) == "preempted"
    cluster.step()
    assert cluster.held(first) == 1 and cluster.held(second) == 1


def test_a_higher_priority_job_takes_every_collector_and_gives_them_back(tmp_path):
    cluster = Cluster(tmp_path)
    cluster.add("collector", 4)
    cluster.add("learner", 3)
    low = [cluster.submit(dqn()) for _ in range(2)]
    cluster.run(2)
    urgent = cluster.submit(dqn(priority=10))
    cluster.step()  # releases
    cluster.step()  # the freed collectors go to it
    assert cluster.held(urgent) == 4 and all(cluster.held(j) == 0 for j in low)
    reason = cluster.status(low[0])["reason"]
    assert "higher priority" in reason and urgent in reason
    assert cluster.status(urgent)["priority"] == 10
    cluster.client.delete(f"/api/v1/jobs/{urgent}", headers=AUTH)
    cluster.run(1)
    assert [cluster.held(j) for j in low] == [2, 2]


def test_a_sync_round_gets_its_collectors_whole_and_all_jobs_progress(tmp_path):
    """A sync PPO job needing 2 collectors beside two DQN jobs on 3: its set is given
    whole or not at all, and over time every job holds collectors."""
    cluster = Cluster(tmp_path)
    cluster.add("collector", 3)
    cluster.add("learner", 3)
    ppo = cluster.submit(PPO)
    dqns = [cluster.submit(dqn()) for _ in range(2)]
    seconds = collections.Counter()
    for _ in range(600):
        cluster.step()
        assert cluster.held(ppo) in (0, 2)
        for job in (ppo, *dqns):
            seconds[job] += cluster.held(job) * 0.5
    total = sum(seconds.values())
    assert all(seconds[j] / total == pytest.approx(1 / 3, rel=0.2) for j in (ppo, *dqns))
    # Its tasks split a round of 64 over its set of 2.
    specs = [t.spec for t in cluster.core.tasks.values() if t.job_id == ppo and t.kind == "collect"]
    assert all(s.round_steps == 32 for s in specs)


def test_a_round_that_cannot_fit_says_so(tmp_path):
    cluster = Cluster(tmp_path)
    cluster.add("collector", 1)
    cluster.add("learner", 1)
    ppo = cluster.submit(PPO)
    cluster.run(2)
    assert cluster.held(ppo) == 0
    assert "waiting for 2 collectors at once" in cluster.status(ppo)["reason"]


def test_fewer_learners_than_jobs_take_turns_at_checkpoints(tmp_path):
    cluster = Cluster(tmp_path, learner_slack_s=10.0)
    cluster.add("collector", 2)
    cluster.add("learner", 1)
    first = cluster.submit(dqn())
    cluster.run(2)
    second = cluster.submit(dqn())
    cluster.step()
    # The first learner's job holds it: the other waits, with no collector either
    # (nothing would train on what they collect).
    assert cluster.held(first, "learn") == 1 and cluster.held(second) == 0
    status = cluster.status(second)
    assert status["reason"].startswith("waiting for a learner: 2 jobs of priority 0 share 1")
    assert status["learner_share"]["owed"] == 0.5
    turns = []
    without = collections.Counter()
    for _ in range(200):
        cluster.step()
        holder = [j for j in (first, second) if cluster.held(j, "learn")]
        if holder and (not turns or turns[-1] != holder[0]):
            turns.append(holder[0])
        for job in (first, second):
            without[job] = 0 if cluster.held(job, "learn") else without[job] + 1
            # Its collectors go with its learner (a pass later for the one taking it:
            # its learn task is assigned once the learner is free).
            assert without[job] < 2 or cluster.held(job) == 0
    assert len(turns) >= 4  # they take turns, each about learner_slack_s long
    released_learns = [t for t in cluster.released if t.startswith("learn")]
    assert released_learns and all(
        cluster.core.task_state(t) == "preempted" for t in released_learns
    )


def test_a_new_job_waits_its_turn_for_a_learner_however_long_the_others_held_them(tmp_path):
    """Two jobs held the two learners for 10 minutes while third jobs came for 3 s
    each (owed a share all along, never given one): a new job is not owed those 10
    minutes (it starts level with them), so it waits about `learner_slack_s` for a
    learner, as they will for theirs."""
    cluster = Cluster(tmp_path)
    cluster.add("collector", 2)
    cluster.add("learner", 2)
    long = [cluster.submit(dqn()), cluster.submit(dqn())]
    cluster.step()
    for _ in range(200):
        passer = cluster.submit(dqn())
        cluster.run(3, step_s=1.0)
        cluster.client.delete(f"/api/v1/jobs/{passer}", headers=AUTH)
    assert all(cluster.held(j, "learn") == 1 for j in long)
    assert cluster.status(long[0])["learner_share"]["owed_s"] < 600 * 0.7
    late = cluster.submit(dqn())
    cluster.run(20)
    assert cluster.held(late, "learn") == 0
    assert all(cluster.held(j, "learn") == 1 for j in long)
    cluster.run(120)
    assert cluster.held(late, "learn") == 1


def test_a_job_waiting_for_a_learner_keeps_collectors_nobody_else_wants(tmp_path):
    """Learners came after the collectors and fewer than the jobs: a job given none
    keeps the collectors the others cannot use (nothing is released for nobody)."""
    cluster = Cluster(tmp_path)
    cluster.add("collector", 3)
    jobs = [cluster.submit(dqn(collector_num=1)) for _ in range(3)]
    cluster.step()
    assert [cluster.held(j) for j in jobs] == [1, 1, 1]
    cluster.add("learner", 2)
    cluster.run(5)
    assert [cluster.held(j) for j in jobs] == [1, 1, 1] and not cluster.released
    assert sorted(cluster.held(j, "learn") for j in jobs) == [0, 1, 1]


def test_the_queue_runs_jobs_in_priority_then_submission_order(tmp_path):
    cluster = Cluster(tmp_path, max_running_jobs=2)
    cluster.add("collector", 2)
    cluster.add("learner", 2)
    first, second = cluster.submit(dqn()), cluster.submit(dqn())
    third = cluster.submit(dqn())
    fourth = cluster.submit(dqn(priority=5))
    created = post(cluster.client, "/api/v1/jobs", {"config": dqn()}).json
    assert created["phase"] == "queued"
    fifth = created["job_id"]
    cluster.step()
    positions = {j: cluster.status(j)["queue_position"] for j in (third, fourth, fifth)}
    assert positions == {fourth: 1, third: 2, fifth: 3}
    status = cluster.status(third)
    assert status["phase"] == "queued"
    assert status["reason"].startswith("queued: 2nd of 3 waiting for one of the 2 places")
    assert cluster.held(third) == 0 and status["collector_share"] is None
    # A queued job takes no data.
    ref = write_segment(cluster.core, third, 0)
    resp = post(cluster.client, f"/api/v1/jobs/{third}/segments", {"segments": [ref]})
    assert resp.status_code == 409 and resp.json["error"] == "job_queued"
    # A queued job can be stopped; an ended running one lets the next in.
    cluster.client.delete(f"/api/v1/jobs/{fifth}", headers=AUTH)
    assert cluster.status(fifth)["phase"] == "stopped"
    cluster.client.delete(f"/api/v1/jobs/{first}", headers=AUTH)
    cluster.step()
    assert cluster.status(fourth)["phase"] == "running"
    assert cluster.status(third)["queue_position"] == 1
    listed = {j["job_id"]: j for j in get(cluster.client, "/api/v1/jobs").json["jobs"]}
    assert listed[third]["queue_position"] == 1 and listed[second]["queue_position"] is None


def test_queue_order_and_shares_survive_a_restart(tmp_path):
    cluster = Cluster(tmp_path, max_running_jobs=2)
    cluster.add("collector", 3)
    cluster.add("learner", 2)
    running = [cluster.submit(dqn()), cluster.submit(dqn())]
    queued = [cluster.submit(dqn()), cluster.submit(dqn(priority=1))]
    cluster.run(10)
    before = {j: cluster.status(j)["collector_share"] for j in running}
    cluster.core.snapshot_jobs()
    cluster.restart()
    assert [cluster.status(j)["phase"] for j in running] == ["running", "running"]
    cluster.add("collector", 3)
    cluster.add("learner", 2)
    cluster.step()
    assert {j: cluster.status(j)["queue_position"] for j in queued} == {
        queued[1]: 1,
        queued[0]: 2,
    }
    for job in running:
        after = cluster.status(job)["collector_share"]
        # What was owed and held goes on from where it was.
        assert after["owed_s"] >= before[job]["owed_s"] > 0
        assert after["held_s"] >= before[job]["held_s"] > 0
    cluster.client.delete(f"/api/v1/jobs/{running[0]}", headers=AUTH)
    cluster.step()
    assert cluster.status(queued[1])["phase"] == "running"
    assert cluster.status(queued[0])["phase"] == "queued"


def test_an_evaluation_runs_on_one_of_the_jobs_own_collectors(tmp_path):
    """With every collector busy, a job's evaluation goes beside its own collect task,
    not another job's (which it would slow down)."""
    cluster = Cluster(tmp_path)
    cluster.add("collector", 4)
    cluster.add("learner", 2)
    first, second = cluster.submit(dqn()), cluster.submit(dqn())
    cluster.step()
    for job_id in (first, second):
        ref = write_segment(cluster.core, job_id, 0)
        inserted = post(cluster.client, f"/api/v1/jobs/{job_id}/segments", {"segments": [ref]})
        assert inserted.status_code == 200 and inserted.json["accepted"] == 1, inserted.json
    path, sha = cluster.core.store.write_policy(second, 1, 10, "dqn", {"w": np.ones(2, np.float32)})
    body = {"version": 1, "path": path, "sha256": sha, "train_iter": 10}
    assert post(cluster.client, f"/api/v1/jobs/{second}/policies", body).status_code == 201
    cluster.step()
    tasks = list(cluster.core.tasks.values())
    (evaluation,) = [t for t in tasks if t.kind == "evaluate"]
    assert evaluation.job_id == second
    own = {t.worker_id for t in tasks if t.job_id == second and t.kind == "collect"}
    assert evaluation.worker_id in own


def test_shares_are_prometheus_gauges(tmp_path):
    cluster = Cluster(tmp_path, max_running_jobs=1)
    cluster.add("collector", 2)
    cluster.add("learner", 1)
    running, queued = cluster.submit(dqn()), cluster.submit(dqn())
    cluster.run(2)
    text = get(cluster.client, "/metrics").data.decode()
    assert f'drover_job_collectors_owed{{job_id="{running}"}} 2.0' in text
    assert f'drover_job_collectors_held{{job_id="{running}"}} 2.0' in text
    assert f'drover_job_learners_held{{job_id="{running}"}} 1.0' in text
    assert f'drover_job_queue_position{{job_id="{queued}"}} 1.0' in text
    assert f'drover_job_priority{{job_id="{running}"}} 0.0' in text
