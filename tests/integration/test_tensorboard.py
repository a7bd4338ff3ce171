"""A short CartPole DQN job leaves TensorBoard event files that TensorBoard reads."""

import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from drover.local import LocalCluster
from jobconfig import load_config_file
from tests.helpers import EXAMPLE, wait_for_end

pytestmark = pytest.mark.processes

DEADLINE_S = 50

COORDINATOR_TAGS = {
    "eval/return_mean",
    "eval/return_std",
    "eval/return_min",
    "eval/return_max",
    "throughput/env_steps_per_s",
    "buffer/size",
    "buffer/samples_per_insert",
    "buffer/sampled_policy_lag_mean",
    "tasks/failures",
    "tasks/reassigned",
}
LEARNER_TAGS = {
    "loss/td",
    "value/q_mean",
    "value/target_q_mean",
    "value/td_abs_mean",
    "optim/grad_norm",
    "optim/learning_rate",
    "train/updates_per_s",
    "train/samples_per_s",
    "train/sample_wait_fraction",
    "train/busy_fraction",
}


def scalars(folder):
    events = EventAccumulator(str(folder))
    events.Reload()
    return events, set(events.Tags()["scalars"])


def test_a_job_writes_coordinator_and_learner_scalars(tmp_path):
    config = load_config_file(EXAMPLE)
    # No return goal: the job succeeds at its 4,000 env steps, evaluated every 50 iters.
    config["env"]["stop_value"] = None
    config["policy"]["eval"]["evaluator"]["eval_freq"] = 50
    config["system"]["max_env_step"] = 4000
    started = time.monotonic()
    with LocalCluster(tmp_path / "run", num_collectors=1) as cluster:
        created = cluster.client.submit_job(config, name="tb")
        status = wait_for_end(cluster, created.job_id, DEADLINE_S)
        assert status.phase == "succeeded", status
    tb = cluster.run_dir / created.job_id / "tb"
    assert sorted(p.name for p in tb.iterdir()) == ["coordinator", "learner"]
    for source, expected in (("coordinator", COORDINATOR_TAGS), ("learner", LEARNER_TAGS)):
        events, tags = scalars(tb / source)
        assert expected <= tags, (source, expected - tags)
        for tag in expected:
            steps = [e.step for e in events.Scalars(tag)]
            assert steps and all(a < b for a, b in zip(steps, steps[1:], strict=False)), (
                source,
                tag,
                steps,
            )
    # the last evaluation is the one the job reports
    last = status.last_eval
    assert last is not None
    final = events_of(tb / "coordinator", "eval/return_mean")[-1]
    assert final.step == last.env_steps
    assert final.value == pytest.approx(last.return_mean, rel=1e-6)
    low = events_of(tb / "coordinator", "eval/return_min")[-1].value
    high = events_of(tb / "coordinator", "eval/return_max")[-1].value
    assert (low, high) == (pytest.approx(last.return_min), pytest.approx(last.return_max))
    assert low <= final.value <= high
    # the budget the job stopped at is in its status
    assert status.max_env_step == 4000 and status.env_steps >= 4000
    assert time.monotonic() - started < 60


def events_of(folder, tag):
    events, _ = scalars(folder)
    return events.Scalars(tag)
