"""Jobs sharing real collectors and learners (services/coordinator/sharing.py): a job
submitted to a busy cluster is given collectors within seconds, taken from the job that
held them all by releasing a collect task at a segment boundary; a sync round's
collectors are held whole, in turns; and nothing acknowledged is lost for it: each
job's buffer took exactly its counted env steps."""

from __future__ import annotations

import time

import pytest
import yaml

from common.config import deep_merge
from drover.local import LocalCluster
from tests.helpers import EXAMPLES, scrape, total, wait_for_end, wait_until

pytestmark = [pytest.mark.processes]

METRICS_TOKEN = "sharing-metrics-token"
DEADLINE_S = 180


def example(name: str, overlay: dict) -> dict:
    return deep_merge(yaml.safe_load((EXAMPLES / name).read_text()), overlay)


#: DQN with 1-step transitions (a segment's rows are its env steps), no goal.
DQN = example(
    "cartpole_dqn.yaml",
    {
        "env": {"stop_value": None, "collector_env_num": 4, "n_evaluator_episode": 2},
        "policy": {"nstep": 1, "other": {"replay_buffer": {"min_size_to_sample": 200}}},
        "system": {"max_env_step": 4000},
    },
)
#: PPO rounds of 256 env steps over its 2 collectors.
PPO = example(
    "cartpole_ppo.yaml",
    {
        "env": {"stop_value": None, "collector_env_num": 4, "n_evaluator_episode": 2},
        "policy": {"learn": {"epoch_per_collect": 2}, "collect": {"n_sample": 256}},
        "system": {"max_env_step": 3072, "collector_num": 2},
    },
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    env = {"DROVER_METRICS_TOKEN": METRICS_TOKEN}
    with LocalCluster(
        tmp_path_factory.mktemp("sharing") / "run", num_collectors=2, num_learners=2, extra_env=env
    ) as running:
        running.wait_for_workers()
        yield running


def released_tasks(cluster) -> float:
    """Collect tasks the collectors ended by a release (and reported complete)."""
    return sum(
        total(scrape(s.url, METRICS_TOKEN), "drover_tasks", kind="collect", outcome="released")
        for s in cluster.collectors
    )


def assert_nothing_lost(cluster, job_id):
    """Every env step the job counts came from an insert it acknowledged, once."""
    status = cluster.client.job(job_id)
    buffer = cluster.client.buffer_stats(job_id)
    assert status.phase == "succeeded", status
    assert buffer["inserts"] == status.env_steps, (buffer, status)


def test_a_new_job_takes_a_collector_from_the_busy_one_and_nothing_is_lost(cluster):
    released_before = released_tasks(cluster)
    first = cluster.client.submit_job(DQN, name="first").job_id
    wait_until(
        lambda: (
            cluster.client.job(first).collector_share.held == 2
            and cluster.client.job(first).env_steps > 500
        ),
        what="the first job collecting on both collectors",
        timeout_s=60,
    )
    submitted = time.monotonic()
    second = cluster.client.submit_job(DQN, name="second").job_id
    wait_until(
        lambda: cluster.client.job(second).env_steps > 0,
        what="the second job's first env steps",
        timeout_s=30,
    )
    assert time.monotonic() - submitted < 15  # seconds, not the first job's whole budget
    status = cluster.client.job(first)
    assert status.tasks_preempted >= 1 and status.collector_share.held == 1
    for job_id in (first, second):
        wait_for_end(cluster, job_id, DEADLINE_S)
        assert_nothing_lost(cluster, job_id)
    # The collector ended its task itself, at a segment boundary, and said so.
    assert released_tasks(cluster) > released_before


def test_a_sync_round_holds_its_collectors_in_turns_beside_another_job(cluster):
    ppo = cluster.client.submit_job(PPO, name="ppo").job_id
    dqn = cluster.client.submit_job(DQN, name="dqn").job_id
    held = set()  # collectors the PPO job held, at each look while it ran
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        statuses = [cluster.client.job(j) for j in (ppo, dqn)]
        if all(s.phase != "running" for s in statuses):
            break
        share = statuses[0].collector_share
        if statuses[0].phase == "running" and share is not None:
            held.add(share.held)
        time.sleep(0.2)
    assert 2 in held, held  # its rounds ran with its whole set
    for job_id in (ppo, dqn):
        assert_nothing_lost(cluster, job_id)
    # On-policy all the same: every item trained on was collected by the version trained.
    assert sum(cluster.client.buffer_stats(ppo)["sampled_lag_histogram"][1:]) == 0


def test_two_jobs_take_turns_on_one_learner_resuming_from_their_checkpoints(tmp_path):
    """One learner, two jobs: each holds it for about a second in turn (a short learner
    slack), its learn task released after a checkpoint and resumed from it later; both
    jobs train to their budgets, their policy versions only ever grow, and nothing
    acknowledged is lost."""
    env = {"DROVER_METRICS_TOKEN": METRICS_TOKEN, "DROVER_LEARNER_SLACK_S": "1"}
    # The learner sets each job's pace (samples_per_insert), so neither can reach its
    # budget in one turn on a fast machine: here each took 3 to 7 turns of ~1 s.
    budget = deep_merge(
        DQN,
        {
            "policy": {"other": {"replay_buffer": {"samples_per_insert": 32.0}}},
            "system": {"max_env_step": 6000},
        },
    )
    with LocalCluster(tmp_path / "run", num_collectors=2, num_learners=1, extra_env=env) as c:
        c.wait_for_workers()
        jobs = [c.client.submit_job(budget, name=f"turns-{i}").job_id for i in range(2)]
        versions: dict[str, list[int]] = {j: [] for j in jobs}
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            statuses = {j: c.client.job(j) for j in jobs}
            for job_id, status in statuses.items():
                versions[job_id].append(status.policy_version)
            if all(s.phase != "running" for s in statuses.values()):
                break
            time.sleep(0.2)
        for job_id in jobs:
            assert_nothing_lost(c, job_id)
            assert versions[job_id] == sorted(versions[job_id])
            assert c.client.job(job_id).tasks_preempted >= 1, versions[job_id]
        learner = scrape(c.learners[0].url, METRICS_TOKEN)
        assert total(learner, "drover_tasks", kind="learn", outcome="released") >= 2
