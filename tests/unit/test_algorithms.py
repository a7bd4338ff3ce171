"""The Algorithm seam: every registered algorithm keeps the contract in
`algorithms/base.py`, and an algorithm added to the registry (and nowhere else) is
picked up by the config, the collector and the learner."""

from __future__ import annotations

import threading
import typing
from typing import Any

import numpy as np
import pytest
import torch

from algorithms.base import (
    ACTOR_PROTOCOLS,
    LEARNER_PROTOCOLS,
    SCALAR_GROUPS,
    UNIT_COLUMNS,
    ActionSpace,
    Algorithm,
    CollectUnit,
    RecordingActor,
)
from algorithms.registry import ALGORITHMS
from common.checkpoint_file import Checkpoint, decode_checkpoint, encode_checkpoint
from common.config import ConfigError, to_dict
from common.messages import (
    LearnSpec,
    SampledBatch,
    SampledSegment,
)
from common.models import state_to_numpy
from common.storage import SharedStore
from jobconfig import from_resolved, resolve_job_config, with_spaces
from services.coordinator.workflows import WORKFLOWS, check_workflow
from services.learner.core import LearnerRunner
from services.learner.segments import SegmentSchema
from tests import toy_algorithm
from tests.algorithm_runs import (
    CASES,
    JOB,
    Ctx,
    FakeCoordinator,
    collect_one_segment,
    job_config,
    publish_fresh_policy,
    synthetic_columns,
    train_once,
)


def within(expected: Any, actual: Any, path: str = "config") -> None:
    """Every key of `expected` (nested) has its value in `actual`."""
    if isinstance(expected, dict):
        for key, value in expected.items():
            within(value, actual[key], f"{path}.{key}")
    else:
        assert actual == expected, path


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_declares_what_the_others_read(name):
    algo = ALGORITHMS[name]
    assert isinstance(algo, Algorithm) and algo.name == name
    assert algo.collect_unit in typing.get_args(CollectUnit)
    # some workflow runs it, and its default workflow does
    assert any(algo.collect_unit in w.collect_units for w in WORKFLOWS.values())
    assert algo.action_spaces and algo.action_spaces <= set(typing.get_args(ActionSpace))
    # each column once, and each its unit's loop writes unless its actor records it
    assert len(set(algo.column_names)) == len(algo.columns)
    loop_columns = {c.name for c in algo.columns if not c.from_actor}
    assert loop_columns <= UNIT_COLUMNS[algo.collect_unit]
    if any(c.from_actor for c in algo.columns):
        actor = algo.make_actor(job_config(name, sorted(algo.action_spaces)[0]).policy)
        assert isinstance(actor, RecordingActor)
    config, warnings = resolve_job_config({"policy": {"type": name}})
    assert warnings == []  # every default names a key the config knows
    within(algo.defaults, to_dict(config))
    assert check_workflow(config) is WORKFLOWS[config.system.workflow]


@pytest.mark.parametrize(("name", "space"), CASES)
def test_actor_and_learner_fit_each_other_and_train(name, space):
    torch.manual_seed(0)
    algo = ALGORITHMS[name]
    config = job_config(name, space)
    actor = algo.make_actor(config.policy)
    learner = algo.make_learner(config.policy, "cpu")
    assert isinstance(actor, ACTOR_PROTOCOLS[algo.collect_unit])
    assert isinstance(learner, LEARNER_PROTOCOLS[algo.collect_unit])

    # The actor acts with what the learner publishes.
    actor.load(3, state_to_numpy(learner.online))
    assert (actor.version, actor.loaded) == (3, True)
    obs = np.zeros((2, config.policy.model.obs_shape), np.float32)
    assert len(actor.greedy(obs, np.random.default_rng(0))) == 2

    # One update on the columns it reads moves the published network.
    rows = 8
    before = {k: v.copy() for k, v in state_to_numpy(learner.online).items()}  # not views
    columns = synthetic_columns(config, algo.column_names_for(config.policy), rows)
    report = train_once(learner, columns, rows)
    assert np.isfinite(report.loss) and learner.train_iter >= 1 and learner.skipped_updates == 0
    after = state_to_numpy(learner.online)
    assert any(not np.array_equal(before[k], after[k]) for k in before)

    # Its checkpoint state resumes it exactly, through a checkpoint file.
    checkpoint = Checkpoint(model=learner.state_dict(), policy_version=3, algo=name)
    state = decode_checkpoint(encode_checkpoint(checkpoint), "checkpoint").model
    assert "online" in state  # what evaluating a checkpoint reads
    resumed = algo.make_learner(config.policy, "cpu")
    resumed.load_state_dict(state)
    assert resumed.train_iter == learner.train_iter
    assert all(np.array_equal(after[k], v) for k, v in state_to_numpy(resumed.online).items())

    # A published version's weights are taken as they are.
    fresh = algo.make_learner(config.policy, "cpu")
    fresh.load_policy(after)
    assert all(np.array_equal(after[k], v) for k, v in state_to_numpy(fresh.online).items())


@pytest.mark.parametrize(("name", "space"), CASES)
def test_reports_name_each_loss_term_the_gradient_norm_and_learning_rate(name, space):
    """What the learner's TensorBoard shows: `<group>/<name>` tags, the same at every
    update, with every loss term, a gradient norm and the learning rate in them."""
    torch.manual_seed(0)
    algo = ALGORITHMS[name]
    config = job_config(name, space)
    learner = algo.make_learner(config.policy, "cpu")
    rows = 8
    columns = synthetic_columns(config, algo.column_names_for(config.policy), rows)
    first, second = (train_once(learner, columns, rows).scalars for _ in range(2))
    assert list(first) == list(second)  # a learner group merges them by position
    groups = {tag.split("/")[0] for tag in first}
    assert groups <= set(SCALAR_GROUPS) and {"loss", "value", "optim"} <= groups
    assert all(np.isfinite(v) for v in first.values()), first
    norms = [v for tag, v in first.items() if tag.endswith("grad_norm")]
    assert norms and all(v > 0 for v in norms)
    rates = [v for tag, v in first.items() if tag.endswith("learning_rate")]
    assert config.policy.learn.learning_rate in rates
    # Several loss terms where the loss has several (PPO, IMPALA, SAC).
    if name in ("ppo", "impala", "sac"):
        assert sum(tag.startswith("loss/") for tag in first) >= 3
        assert "policy/entropy" in first


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("name", "space"), CASES)
def test_the_collector_writes_the_columns_the_algorithm_declares(tmp_path, name, space):
    torch.manual_seed(0)
    store = SharedStore(tmp_path)
    config = job_config(name, space)
    algo = ALGORITHMS[name]
    ref, columns = collect_one_segment(store, config, publish_fresh_policy(store, config))
    assert sorted(columns) == sorted(algo.column_names_for(config.policy))
    assert ref.policy_version == 1 and ref.rows == len(columns["obs"]) > 0
    # ... and they pass the learner's checks of the columns it reads.
    SegmentSchema.for_policy(config.policy, algo.column_names_for(config.policy)).check(columns)


# An algorithm added to the registry, and nowhere else.


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(ALGORITHMS, "toy", toy_algorithm.SPEC)
    return toy_algorithm.SPEC


def test_an_unregistered_algorithm_is_refused_naming_the_known_ones():
    with pytest.raises(ConfigError) as err:
        resolve_job_config({"policy": {"type": "toy"}})
    assert err.value.field == "policy.type"
    known = ", ".join(sorted(ALGORITHMS))
    assert err.value.message == f"unknown algorithm 'toy' (known: {known})"


def test_a_registered_algorithm_is_known_to_the_config(toy):
    config, warnings = resolve_job_config({"policy": {"type": "toy"}})
    assert warnings == [] and config.policy.type == "toy"
    assert config.policy.learn.learning_rate == toy_algorithm.LEARNING_RATE  # its defaults
    assert from_resolved(to_dict(config)) == config  # a job.json of it reads back
    with pytest.raises(ConfigError) as err:
        check_workflow(
            resolve_job_config({"policy": {"type": "toy"}, "system": {"workflow": "sync"}})[0]
        )
    assert (err.value.field, err.value.message) == ("system.workflow", "toy runs async or evaluate")
    with pytest.raises(ConfigError, match="TOY needs discrete actions"):
        with_spaces(config, 3, 1, "continuous", ([-2.0], [2.0]))


def test_a_registered_algorithms_own_knob_is_read_bounded_and_typo_checked(toy):
    """`learn.td_clip` is declared in the toy's config class alone."""
    config, warnings = resolve_job_config({"policy": {"type": "toy", "learn": {"td_clip": "0.5"}}})
    assert warnings == [] and config.policy.learn.td_clip == 0.5
    with pytest.raises(ConfigError) as err:
        resolve_job_config({"policy": {"type": "toy", "learn": {"td_clip": -1}}})
    assert err.value.field == "policy.learn.td_clip"
    with pytest.raises(ConfigError) as err:
        resolve_job_config({"policy": {"type": "toy", "learn": {"td_clp": 1}}})
    assert err.value.field == "policy.learn.td_clp"
    assert err.value.message.startswith("unknown key (did you mean 'td_clip'?)")
    _, warnings = resolve_job_config({"policy": {"type": "dqn", "learn": {"td_clip": 1}}})
    assert warnings == ["policy.learn.td_clip: ignored, dqn does not use it (toy does)"]


@pytest.mark.timeout(60)
def test_a_registered_algorithm_collects_and_learns_through_the_services(
    tmp_path, toy, monkeypatch
):
    torch.manual_seed(0)
    store = SharedStore(tmp_path)
    # The coordinator is a fake in this process: batches come through a thread.
    learn = {"batch_size": 8, "td_clip": 0.25, "feed": "thread"}
    config = job_config("toy", "discrete", policy={"learn": learn})
    ref, columns = collect_one_segment(store, config, publish_fresh_policy(store, config))
    assert sorted(columns) == sorted(toy.column_names)
    # its own vector column: written by the collector from what its actor recorded
    assert columns["acted_q"].shape == (ref.rows, 2) and columns["acted_q"].dtype == np.float32
    seen: list[tuple[float | None, tuple[int, ...]]] = []
    learn_batch = toy_algorithm.ToyLearner.learn_batch

    def spying(self, columns, weights):
        seen.append((self.td_clip, columns["acted_q"].shape))
        return learn_batch(self, columns, weights)

    monkeypatch.setattr(toy_algorithm.ToyLearner, "learn_batch", spying)

    stop = threading.Event()
    coordinator = FakeCoordinator(stop)
    rows = list(range(8))
    coordinator.batches = [
        SampledBatch(
            keys=rows, segments=[SampledSegment(path=ref.path, rows=rows)], weights=[1.0] * 8
        )
        for _ in range(3)
    ]
    result = LearnerRunner(store).learn(Ctx(coordinator, stop), config, LearnSpec(seed=0))
    assert result["train_iter"] == 3  # one update a batch
    # the learner checked the column and trained with it, and with the knob
    assert seen == [(0.25, (8, 2))] * 3
    newest = coordinator.announced[-1]
    assert store.read_policy(newest.path).algo == "toy"
    assert newest.train_iter == result["train_iter"]
    assert store.list_dir(f"{JOB}/checkpoints") == [
        store.checkpoint_path(JOB, result["train_iter"]).rsplit("/", 1)[1]
    ]
