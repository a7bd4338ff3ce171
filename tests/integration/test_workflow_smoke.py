"""One short job per workflow through real processes (a coordinator, 2 collectors and a
learner on 127.0.0.1), each ended by its budget rather than by a return goal, checked
for what every job of the pipeline must keep, whatever it learns:

- every env step the coordinator counts came from an insert it acknowledged, once:
  the items its buffer took equal the job's env steps (one item per env step in these
  configs: DQN with 1-step transitions, PPO's rounds), and the collectors took at least
  as many steps; an evaluate job inserts nothing and counts its episodes' steps;
- policy versions strictly increase, and train iterations and env steps never go back
  (seen in the status and the newest policy, polled all along, and in the job's metrics);
- at least one evaluation happened;
- no service answered a 5xx, but for the learner's sample long-polls that found no data
  (503 sample_timeout, which it waits out by design), each counted as one; nor logged an
  unhandled error.

`make test-fast` runs these; the learning tests (marker `learning`) check the rest."""

from __future__ import annotations

import csv
import io
import threading

import pytest
import yaml

from common.config import deep_merge
from common.errors import ApiError
from drover.local import LocalCluster
from services.coordinator.workflows import WORKFLOWS
from tests.helpers import EXAMPLES, scrape, total, wait_for_end

pytestmark = [pytest.mark.processes, pytest.mark.smoke]

METRICS_TOKEN = "smoke-metrics-token"
SAMPLES_ROUTE = "/api/v1/jobs/<job_id>/samples"
JOB_DEADLINE_S = 120


def example(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / name).read_text())


#: Each registered workflow's smoke job.
JOBS = {
    # DQN, 2,000 env steps; 1-step transitions: a segment's rows are its env steps.
    "async": deep_merge(
        example("cartpole_dqn.yaml"),
        {
            "env": {"stop_value": None, "collector_env_num": 4, "n_evaluator_episode": 2},
            "policy": {
                "nstep": 1,
                "learn": {"publish_every_iters": 20, "checkpoint_every_iters": 200},
                "eval": {"evaluator": {"eval_freq": 100}},
                "other": {"replay_buffer": {"min_size_to_sample": 200}},
            },
            "system": {"max_env_step": 2000},
        },
    ),
    # PPO, rounds of 256 env steps over 2 collectors, evaluated every round (8 updates).
    "sync": deep_merge(
        example("cartpole_ppo.yaml"),
        {
            "env": {"stop_value": None, "collector_env_num": 4, "n_evaluator_episode": 2},
            "policy": {
                "learn": {"epoch_per_collect": 2},
                "collect": {"n_sample": 256},
                "eval": {"evaluator": {"eval_freq": 8}},
            },
            "system": {"max_env_step": 1536},
        },
    ),
    # PPO self-play on tic-tac-toe: rounds of 256 moves, a battle evaluation of 4 games
    # against each baseline every 2 rounds.
    "selfplay": deep_merge(
        example("tictactoe_selfplay.yaml"),
        {
            "env": {"collector_env_num": 4, "n_evaluator_episode": 4},
            "policy": {
                "learn": {"epoch_per_collect": 2, "batch_size": 64},
                "collect": {"n_sample": 256},
                "eval": {"evaluator": {"eval_freq": 16}},
                "other": {"league": {"stop": None}},
            },
            "system": {"max_env_step": 3000},
        },
    ),
    # Random actions for 6 episodes, shared by the collectors.
    "evaluate": deep_merge(
        example("cartpole_evaluate_random.yaml"),
        {"env": {"evaluator_env_num": 2}, "system": {"evaluate": {"episodes": 6}}},
    ),
}


def test_every_registered_workflow_has_a_smoke_job():
    assert sorted(JOBS) == sorted(WORKFLOWS)
    for name, config in JOBS.items():
        assert config["system"]["workflow"] == name


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    env = {"DROVER_METRICS_TOKEN": METRICS_TOKEN}
    with LocalCluster(
        tmp_path_factory.mktemp("smoke") / "run", num_collectors=2, extra_env=env
    ) as running:
        running.wait_for_workers()
        yield running


class Watch:
    """The job's counters and its newest policy, polled in the background until
    `stop()`: what anybody reading the API sees of it over its life."""

    def __init__(self, cluster, job_id):
        self.cluster, self.job_id = cluster, job_id
        self.counters: list[tuple[int, int, int]] = []  # (env steps, train iters, version)
        self.policies: list[tuple[int, int]] = []  # (version, train_iter), when it changes
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self):
        client = self.cluster.client
        while not self._stop.wait(0.1):
            try:
                status = client.job(self.job_id)
                self.counters.append((status.env_steps, status.train_iters, status.policy_version))
                ref = client.latest_policy(self.job_id)
            except ApiError as exc:
                if exc.status >= 500:
                    self.errors.append(f"{exc.status} {exc.code}: {exc.message}")
                continue  # a 4xx: the job ended between the two calls
            except Exception as exc:  # noqa: BLE001 - recorded, and fails the test
                self.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if ref is not None and (not self.policies or self.policies[-1][0] != ref.version):
                self.policies.append((ref.version, ref.train_iter))

    def stop(self):
        self._stop.set()
        self._thread.join(5)


def server_errors(cluster) -> dict[str, float]:
    """Per service: its 5xx answers so far, less the coordinator's 503s to sample
    long-polls that found no data (`drover_sample_timeouts`)."""
    urls = {service.name: service.url for service in cluster.services}
    out = {}
    for name, url in urls.items():
        families = scrape(url, METRICS_TOKEN)
        errors = sum(
            sample.value
            for sample in families["drover_http_requests"].samples
            if sample.name == "drover_http_requests_total" and int(sample.labels["status"]) >= 500
        )
        if name == "coordinator":
            errors -= total(families, "drover_sample_timeouts")
        out[name] = errors
    return out


def sample_503s(cluster) -> tuple[float, float]:
    """The coordinator's 5xx answers on the samples route, and its sample timeouts."""
    families = scrape(cluster.coordinator_url, METRICS_TOKEN)
    answered = sum(
        sample.value
        for sample in families["drover_http_requests"].samples
        if sample.name == "drover_http_requests_total"
        and sample.labels["route"] == SAMPLES_ROUTE
        and int(sample.labels["status"]) >= 500
    )
    return answered, total(families, "drover_sample_timeouts")


def env_steps_taken(cluster) -> float:
    return sum(total(scrape(s.url, METRICS_TOKEN), "drover_env_steps") for s in cluster.collectors)


def non_decreasing(values) -> bool:
    return all(a <= b for a, b in zip(values, values[1:], strict=False))


@pytest.mark.parametrize("workflow", sorted(JOBS))
def test_a_short_job_keeps_the_pipeline_invariants(cluster, workflow):
    errors_before = server_errors(cluster)
    steps_before = env_steps_taken(cluster)
    job_id = cluster.client.submit_job(JOBS[workflow], name=f"smoke-{workflow}").job_id
    watch = Watch(cluster, job_id)
    try:
        status = wait_for_end(cluster, job_id, JOB_DEADLINE_S)
    finally:
        watch.stop()
    assert status.phase == "succeeded", status
    assert watch.errors == []

    buffer = cluster.client.buffer_stats(job_id)
    metrics = cluster.client.metrics(job_id)
    versions = [version for version, _ in watch.policies]
    if workflow == "evaluate":
        # Nothing is inserted or trained; the env steps counted are the episodes'.
        results = cluster.shared_dir / job_id / "eval" / "results.csv"
        rows = list(csv.DictReader(io.StringIO(results.read_text())))
        assert len(rows) == 6
        assert status.env_steps == sum(int(row["length"]) for row in rows)
        assert (buffer["inserts"], status.train_iters, versions) == (0, 0, [])
    else:
        # Acknowledged inserts are the counted env steps, each counted once, and
        # every one of them was taken by a collector. In games an env step is a move
        # of either side, and the rows are the learning side's moves.
        if workflow == "selfplay":
            assert 0 < buffer["inserts"] <= status.env_steps, (buffer, status)
        else:
            assert buffer["inserts"] == status.env_steps, (buffer, status)
        assert status.env_steps >= JOBS[workflow]["system"]["max_env_step"]
        assert env_steps_taken(cluster) - steps_before >= status.env_steps
        assert status.policy_version >= 2 and status.train_iters > 0, status

    # Versions strictly increase; counters never go back.
    assert versions == sorted(set(versions)), watch.policies
    assert all(version <= status.policy_version for version in versions), watch.policies
    assert non_decreasing([train_iter for _, train_iter in watch.policies]), watch.policies
    for i, what in enumerate(("env steps", "train iters", "policy version")):
        assert non_decreasing([c[i] for c in watch.counters]), (what, watch.counters)
    points = metrics["points"]
    for key in ("env_steps", "train_iters", "policy_version"):
        assert non_decreasing([p[key] for p in points]), (key, points)
    if workflow == "sync":
        # On-policy: every item trained on was collected by the version being trained.
        assert sum(buffer["sampled_lag_histogram"][1:]) == 0, buffer

    # At least one evaluation.
    assert status.last_eval is not None and metrics["evals"], status
    assert non_decreasing([e["policy_version"] for e in metrics["evals"]]), metrics["evals"]

    # No 5xx but the sample long-polls' timeouts; no unhandled error in any log.
    after = server_errors(cluster)
    assert {name: after[name] - errors_before.get(name, 0) for name in after} == {
        name: 0 for name in after
    }
    answered, timeouts = sample_503s(cluster)
    assert answered == timeouts
    for service in cluster.services:
        assert "unhandled error" not in service.log_path.read_text(errors="replace"), (
            service.name,
            service.log_tail(),
        )
