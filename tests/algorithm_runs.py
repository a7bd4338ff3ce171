"""An algorithm's collector and learner loops run in this process against a coordinator
answered in memory: a small job of any registered algorithm, one segment collected
with a fresh policy, a task's context, synthetic columns and one update on them."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
from prometheus_client import CollectorRegistry

from algorithms.base import CollectUnit, RoundLearner
from algorithms.dqn.learner import TransitionBatch
from algorithms.registry import ALGORITHMS
from common.config import JobConfig, deep_merge
from common.messages import (
    CollectSpec,
    InsertReply,
    LearnSpec,
    PolicyRef,
    SampledBatch,
    SampleReply,
    TaskAssignment,
)
from common.models import state_to_numpy
from common.storage import SharedStore
from jobconfig import fit_to_env, resolve_job_config, sequence_length_of
from services.collector.core import CollectorRunner
from services.learner.segments import VALID, SegmentSchema
from services.slave.core import TaskContext

JOB = "job-1"
ENV_IDS: dict[str, str] = {"discrete": "CartPole-v1", "continuous": "Pendulum-v1"}
#: Every registered algorithm with every action space it supports.
CASES = [(name, space) for name, algo in ALGORITHMS.items() for space in sorted(algo.action_spaces)]


def job_config(name: str, space: str, **overrides: Any) -> JobConfig:
    """A small job of algorithm `name` on an env with `space` actions, spaces filled in."""
    small = {
        "env": {"env_id": ENV_IDS[space]},
        "policy": {
            "type": name,
            "collect": {"n_sample": 16, "unroll_len": 4},
            "learn": {"num_batches": 1, "publish_every_iters": 1},
        },
    }
    config, warnings = resolve_job_config(deep_merge(small, overrides))
    # unroll_len is set for every algorithm here: only IMPALA's is not ignored
    assert [w for w in warnings if not w.startswith("policy.collect.unroll_len: ignored")] == []
    return fit_to_env(config)


def fixed_batch(n: int = 32, seed: int = 0) -> TransitionBatch:
    """A batch of random 3-step CartPole-shaped transitions, as DQN's learners take it."""
    rng = np.random.default_rng(seed)
    columns = {
        "obs": rng.normal(size=(n, 4)).astype(np.float32),
        "action": rng.integers(0, 2, n).astype(np.int64),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
        "done": (rng.random(n) < 0.2).astype(np.float32),
        "discount": np.full(n, 0.99**3, dtype=np.float32),
    }
    return TransitionBatch.from_numpy(columns, np.ones(n, dtype=np.float32), torch.device("cpu"))


def synthetic_columns(config: JobConfig, names: tuple[str, ...], rows: int) -> dict:
    """Rows of `names` as the learner's segment checks want them for this job."""
    rng = np.random.default_rng(0)
    schema = SegmentSchema.for_policy(config.policy, names)
    columns: dict[str, np.ndarray] = {}
    for name, spec in schema.columns.items():
        shape = (rows, *spec.shape)
        if spec.kind == "index":
            columns[name] = rng.integers(0, spec.high, shape)
        elif spec.kind == "flag":
            columns[name] = np.zeros(shape, spec.dtype)
        else:
            columns[name] = rng.uniform(-1.0, 1.0, shape).astype(spec.dtype)
    columns = schema.check(columns)
    steps = sequence_length_of(config)
    if steps is None:
        return columns
    # Sequence items: `rows` items of `steps` rows each, the last few padding.
    sequences = {k: np.stack([v] * steps, axis=1) for k, v in columns.items()}
    valid = np.ones((rows, steps), np.float32)
    valid[:, max(1, steps - 2) :] = 0
    return sequences | {VALID: valid}


def train_once(learner: Any, columns: dict, rows: int) -> Any:
    """One update's (or, for a round learner, one round's) report."""
    if isinstance(learner, RoundLearner):
        return learner.train_round(columns, seed=0)
    return learner.learn_batch(columns, np.ones(rows, np.float32))


class FakeCoordinator:
    """The coordinator calls a collect and a learn task make, answered in memory: one
    policy version, inserts recorded, and samples of the segment it is given."""

    def __init__(self, stop: threading.Event, policy: PolicyRef | None = None) -> None:
        self.stop = stop
        self.policy = policy
        self.inserted: list = []
        self.announced: list[PolicyRef] = []
        self.batches: list[SampledBatch] = []

    def latest_policy(self, job_id, *, newer_than=None, timeout_s=0.0):
        return self.policy

    def insert_segments(self, job_id, refs, *, timeout_s, task_id=None):
        self.inserted += refs
        self.stop.set()  # one segment is all a test needs
        rows = sum(ref.rows for ref in refs)
        return InsertReply(accepted=len(refs), duplicates=0, env_steps=rows)

    def sample(self, job_id, *, batch_size, num_batches, timeout_s, task_id, acknowledge, **_):
        if not self.batches:
            self.stop.set()
            return None
        return SampleReply(batches=[self.batches.pop()])

    def announce_policy(self, job_id, ref, *, task_id=None):
        self.announced.append(ref)

    def update_priorities(self, job_id, keys, priorities, *, task_id=None):
        pass


def Ctx(coordinator: Any, stop: threading.Event) -> TaskContext:  # noqa: N802
    """What a running task is given: a `TaskContext` of a task of `JOB`, with `stop`."""
    return TaskContext(
        task=TaskAssignment(task_id="task-1", job_id=JOB, spec=LearnSpec(seed=0)),
        worker_id="worker-1",
        coordinator=coordinator,
        data=coordinator,
        metrics=CollectorRegistry(),
        stop=stop,
    )


def collect_one_segment(store: SharedStore, config: JobConfig, policy: PolicyRef | None):
    """Run the collector's loop for the job's collect unit until one segment is in."""
    stop = threading.Event()
    ctx = Ctx(FakeCoordinator(stop, policy), stop)
    runner = CollectorRunner(store)
    unit: CollectUnit = ALGORITHMS[config.policy.type].collect_unit
    loop = {
        "transitions": runner.collect,
        "unrolls": runner.collect_unrolls,
        "rounds": runner.collect_rounds,
    }[unit]
    loop(ctx, config, CollectSpec(seed=0, num_envs=2, mode=unit))
    (ref, *_) = ctx.coordinator.inserted
    return ref, store.read_segment(ref.path)


def publish_fresh_policy(store: SharedStore, config: JobConfig) -> PolicyRef:
    learner = ALGORITHMS[config.policy.type].make_learner(config.policy, "cpu")
    tensors = state_to_numpy(learner.online)
    path, sha = store.write_policy(JOB, 1, 0, config.policy.type, tensors)
    return PolicyRef(version=1, path=path, sha256=sha, train_iter=0)
