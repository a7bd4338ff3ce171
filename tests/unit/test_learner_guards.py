"""Non-finite values never leave the learner: not as weights, checkpoints, progress or
priorities; and a non-finite loss is not stepped on."""

import contextlib
import json
import os
import time

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from algorithms.dqn.learner import DQN
from algorithms.ppo.learner import PPO
from algorithms.sac.learner import SAC
from algorithms.step import finite_step
from common.checkpoint_file import Checkpoint, write_checkpoint
from common.errors import ApiError
from common.messages import (
    MAX_PRIORITY,
    LearnSpec,
    PolicyRef,
    SampledBatch,
    SampledSegment,
    SampleReply,
    TaskAssignment,
)
from common.models import state_to_numpy
from common.storage import SharedStore
from jobconfig import resolve_job_config, with_spaces
from services.learner.guards import NonFiniteWeights, priorities_of, set_progress
from services.learner.resume import resume
from services.learner.sessions import BatchSession, RoundSession
from services.slave.core import TaskContext
from tests.helpers import wait_until

JOB = "job-1"


class Coordinator:
    def __init__(self):
        self.announced = []
        self.priorities = []

    def announce_policy(self, job_id, ref, *, task_id=None):
        self.announced.append(ref)

    def update_priorities(self, job_id, keys, priorities, *, task_id=None):
        self.priorities.append((keys, priorities))

    def latest_policy(self, job_id):
        return None


def config_of(algo="dqn"):
    config, _ = resolve_job_config({"policy": {"type": algo}})
    if algo == "sac":
        return with_spaces(config, 4, 2, "continuous", ([-1.0, -1.0], [1.0, 1.0]))
    return with_spaces(config, 4, 2)


def context():
    coordinator = Coordinator()
    return TaskContext(
        task=TaskAssignment(task_id="t-1", job_id=JOB, spec=LearnSpec(seed=0)),
        worker_id="learner-1",
        coordinator=coordinator,  # type: ignore[arg-type]
        data=coordinator,  # type: ignore[arg-type]
        metrics=CollectorRegistry(),
    )


def session(tmp_path, dqn=None):
    config = config_of()
    ctx = context()
    dqn = dqn or DQN(config.policy)
    return BatchSession(ctx, config, SharedStore(tmp_path), dqn, 0)


def poison(module):
    with torch.no_grad():
        next(module.parameters())[0].fill_(float("nan"))


def test_finite_weights_are_published(tmp_path):
    learn = session(tmp_path)
    learn.publish()
    assert [ref.version for ref in learn.ctx.coordinator.announced] == [1]
    assert learn.store.list_dir(f"{JOB}/policies") == ["00000001.safetensors"]
    assert learn.ctx.progress["policy_version"] == 1


def test_non_finite_weights_are_neither_published_nor_checkpointed(tmp_path):
    learn = session(tmp_path)
    learn.learner.train_iter = 12
    poison(learn.learner.online)
    with pytest.raises(NonFiniteWeights, match="non-finite weights after train_iter 12"):
        learn.publish()
    assert learn.store.list_dir(f"{JOB}/policies") == []
    assert learn.ctx.coordinator.announced == [] and learn.version == 0
    with pytest.raises(NonFiniteWeights, match="after train_iter 12"):
        learn.checkpoint()
    assert learn.store.list_dir(f"{JOB}/checkpoints") == []


def test_a_resumed_learner_skips_a_checkpoint_with_non_finite_weights(tmp_path):
    learn = session(tmp_path)
    learn.learner.train_iter = 10
    learn.checkpoint()
    learn.learner.train_iter = 20
    poison(learn.learner.online)
    poisoned = Checkpoint(model=learn.learner.state_dict(), policy_version=0, algo="dqn")
    write_checkpoint(learn.store, JOB, 20, poisoned)
    fresh = DQN(config_of().policy)
    resume(learn.store, JOB, "dqn", fresh, learn.ctx)
    assert fresh.train_iter == 10
    assert all(torch.isfinite(p).all() for p in fresh.online.parameters())


def test_a_resumed_learner_passes_over_files_another_algorithm_wrote(tmp_path):
    learn = session(tmp_path)
    learn.learner.train_iter = 10
    learn.checkpoint()
    # Newer than what the job's DQN wrote, with the same tensors, but labeled PPO.
    learn.learner.train_iter = 20
    state = learn.learner.state_dict()
    write_checkpoint(learn.store, JOB, 20, Checkpoint(model=state, policy_version=0, algo="ppo"))
    path, sha = learn.store.write_policy(JOB, 1, 30, "ppo", state_to_numpy(learn.learner.online))
    ref = PolicyRef(version=1, path=path, sha256=sha, train_iter=30)
    learn.ctx.coordinator.latest_policy = lambda job_id: ref
    fresh = DQN(config_of().policy)
    resumed = resume(learn.store, JOB, "dqn", fresh, learn.ctx)
    assert fresh.train_iter == 10 and resumed.policy is None
    assert resumed.checkpoint == learn.store.checkpoint_path(JOB, 10)


def transitions(n=8, reward=0.0):
    return {
        "obs": np.zeros((n, 4), np.float32),
        "action": np.zeros(n, np.int64),
        "reward": np.full(n, reward, np.float32),
        "next_obs": np.zeros((n, 4), np.float32),
        "done": np.zeros(n, np.float32),
        "discount": np.ones(n, np.float32),
    }


@pytest.mark.parametrize("algo", ["dqn", "sac"])
def test_a_non_finite_loss_is_not_stepped_on(algo):
    torch.manual_seed(0)
    policy = config_of(algo).policy
    model = DQN(policy) if algo == "dqn" else SAC(policy)
    columns = transitions(reward=float("nan"))
    if algo == "sac":
        columns["action"] = np.zeros((8, 2), np.float32)
    # the network the reward reaches: DQN's Q network, SAC's critics
    trained = "online" if algo == "dqn" else "critic"
    before = {k: v.clone() for k, v in model.state_dict()[trained].items()}
    info = model.learn_batch(columns, np.ones(8, np.float32))
    assert model.skipped_updates == 1 and model.train_iter == 1
    for name, value in model.state_dict()[trained].items():
        assert torch.equal(value, before[name]), name
    assert priorities_of(info.td_abs) == [MAX_PRIORITY] * 8


@pytest.mark.parametrize("max_grad_norm", [None, 0.01])
def test_a_step_reports_the_gradient_norm_before_clipping(max_grad_norm):
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    loss = layer(torch.ones(4, 3)).pow(2).sum()
    loss.backward(retain_graph=True)
    expected = float(torch.nn.utils.get_total_norm([p.grad for p in layer.parameters()]))
    norm = finite_step(loss, optimizer, layer.parameters(), max_grad_norm)
    assert norm == pytest.approx(expected) and expected > 0.01
    # A non-finite loss takes no step and reports no norm.
    before = [p.clone() for p in layer.parameters()]
    assert finite_step(loss * float("inf"), optimizer, layer.parameters(), max_grad_norm) is None
    assert all(torch.equal(a, b) for a, b in zip(before, layer.parameters(), strict=True))


def test_ppo_skips_non_finite_minibatches():
    torch.manual_seed(0)
    ppo = PPO(config_of("ppo").policy)
    n = 16
    columns = {
        "obs": np.zeros((n, 4), np.float32),
        "action": np.zeros(n, np.int64),
        "logp": np.zeros(n, np.float32),
        "adv": np.full(n, np.inf, np.float32),
        "ret": np.zeros(n, np.float32),
    }
    before = [p.clone() for p in ppo.model.parameters()]
    info = ppo.train_round(columns, seed=0)
    assert ppo.skipped_updates == info.updates > 0
    assert all(torch.equal(a, b) for a, b in zip(before, ppo.model.parameters(), strict=True))


def test_progress_holds_only_values_json_can_carry():
    progress = {"loss": 1.0}
    set_progress(progress, loss=float("nan"), q_mean=float("inf"), big=1e300, train_iter=3, x=-2.5)
    assert progress == {"train_iter": 3, "x": -2.5}
    json.dumps(progress, allow_nan=False)


def test_priorities_are_finite_and_clipped():
    td = np.array([0.5, np.nan, np.inf, 1e30, 0.0], np.float32)
    assert priorities_of(td) == [0.5, MAX_PRIORITY, MAX_PRIORITY, MAX_PRIORITY, 0.0]


def test_sent_priorities_are_clipped_and_sent_once(tmp_path):
    learn = session(tmp_path)
    learn.prioritized = True
    learn.outbox.add(None, *learn.new_priorities([1, 2], [np.array([np.nan, 2.0], np.float32)]))
    learn.sampler.send_last_priorities()
    learn.sampler.send_last_priorities()  # nothing left to send
    assert learn.ctx.coordinator.priorities == [([1, 2], [MAX_PRIORITY, 2.0])]


@pytest.mark.timeout(10)
def test_a_round_keeps_the_rows_and_versions_of_its_usable_segments(tmp_path):
    config = config_of("ppo")
    ctx = context()
    store = SharedStore(tmp_path)
    learn = RoundSession(ctx, config, store, PPO(config.policy), 1)
    good, fifo, nan = (store.segment_path(JOB, "w", i) for i in range(3))
    columns = {
        "obs": np.zeros((3, 4), np.float32),
        "action": np.array([0, 1, 0]),
        "logp": np.zeros(3, np.float32),
        "adv": np.arange(3, dtype=np.float32),
        "ret": np.zeros(3, np.float32),
    }
    store.write_segment(good, columns, header={"policy_version": 1})
    store.write_segment(
        nan, {**columns, "adv": np.full(3, np.nan, np.float32)}, {"policy_version": 0}
    )
    os.mkfifo(store.resolve(fifo))
    batch = SampledBatch(
        keys=list(range(6)),
        segments=[
            SampledSegment(path=good, rows=[0, 1, 2]),
            SampledSegment(path=fifo, rows=[0, 1]),
            SampledSegment(path=nan, rows=[0]),
        ],
        weights=[1.0] * 6,
    )
    round_columns, versions = learn.round_data(SampleReply(batches=[batch]))
    assert round_columns["adv"].tolist() == [0.0, 1.0, 2.0] and versions == [1]
    assert ctx.unusable_segments == {fifo, nan}


@pytest.mark.parametrize("algo", ["dqn", "sac", "ppo"])
def test_a_policy_file_names_the_algorithm_that_wrote_it(tmp_path, algo):
    config = config_of(algo)
    store = SharedStore(tmp_path)
    if algo == "ppo":
        learn = RoundSession(context(), config, store, PPO(config.policy), 0)
    else:
        learner = {"dqn": DQN, "sac": SAC}[algo](config.policy)
        learn = BatchSession(context(), config, store, learner, 0)
    learn.publish()
    assert store.read_policy(store.policy_path(JOB, 1)).algo == algo


def reads_without_a_bound(store, monkeypatch):
    """Make the store open segment files the blocking way, as a read on a hung mount
    does (or any open without O_NONBLOCK): a FIFO's open waits for a writer."""
    for name in ("read_segment", "read_segment_header"):
        read = getattr(store, name)

        def blocking(path, read=read):
            with open(store.resolve(path), "rb") as f:
                f.read()
            return read(path)

        monkeypatch.setattr(store, name, blocking)


def end_of_file(store, path):
    """Open the FIFO for writing and close it: a reader blocked in its open ends."""
    with contextlib.suppress(OSError):  # ENXIO: no reader
        os.close(os.open(store.resolve(path), os.O_WRONLY | os.O_NONBLOCK))


class Sampler(Coordinator):
    """A coordinator that answers one sample request, then says the job is over."""

    def __init__(self, reply):
        super().__init__()
        self.replies = [reply]
        self.requests = []

    def sample(self, job_id, **request):
        self.requests.append(request)
        if not self.replies:
            raise ApiError(404, "not_found", "the job is over")
        return self.replies.pop()


@pytest.mark.timeout(30)
def test_a_segment_whose_read_never_returns_costs_only_its_own_rows(tmp_path, monkeypatch):
    config, _ = resolve_job_config(
        {"policy": {"type": "dqn", "other": {"replay_buffer": {"type": "prioritized"}}}}
    )
    config = with_spaces(config, 4, 2)
    store = SharedStore(tmp_path)
    before, fifo, after = (store.segment_path(JOB, "w", i) for i in range(3))
    rows = {
        "obs": np.zeros((4, 4), np.float32),
        "action": np.array([0, 1, 0, 1]),
        "reward": np.ones(4, np.float32),
        "next_obs": np.zeros((4, 4), np.float32),
        "done": np.zeros(4, np.float32),
        "discount": np.full(4, 0.99, np.float32),
    }
    store.write_segment(before, rows)
    os.mkfifo(store.resolve(fifo))
    store.write_segment(after, rows)
    reads_without_a_bound(store, monkeypatch)

    def batch(*segments):
        keys = [key for _, key, _ in segments]
        return SampledBatch(
            keys=keys,
            segments=[SampledSegment(path=p, rows=[row]) for p, _, row in segments],
            weights=[1.0] * len(keys),
        )

    # The file's rows are in the first batch and the second: the rows around them, and
    # the batch after them, all train.
    reply = SampleReply(
        batches=[
            batch((before, 10, 0), (fifo, 20, 0), (after, 30, 0)),
            batch((fifo, 21, 1), (after, 31, 1)),
            batch((before, 11, 1)),
        ]
    )
    ctx = TaskContext(
        task=TaskAssignment(task_id="t-1", job_id=JOB, spec=LearnSpec(seed=0)),
        worker_id="learner-1",
        coordinator=(sampler := Sampler(reply)),  # type: ignore[arg-type]
        data=sampler,  # type: ignore[arg-type]
        metrics=CollectorRegistry(),
    )
    learn = BatchSession(ctx, config, store, DQN(config.policy), 0)
    learn.cache.read_timeout_s = 0.5
    try:
        started = time.monotonic()
        assert learn.run()["train_iter"] == 3
        assert time.monotonic() - started < 10
        assert ctx.unusable_segments == {fifo}
        assert ctx.progress["unusable_segments"] == 1
        wait_until(lambda: ctx.coordinator.priorities, 10, "priorities to be sent")
        assert sorted(ctx.coordinator.priorities[0][0]) == [10, 11, 30, 31]
    finally:
        end_of_file(store, fifo)


@pytest.mark.timeout(20)
def test_a_round_skips_a_segment_whose_header_read_never_returns(tmp_path, monkeypatch):
    config = config_of("ppo")
    ctx = context()
    store = SharedStore(tmp_path)
    learn = RoundSession(ctx, config, store, PPO(config.policy), 1)
    learn.cache.read_timeout_s = 0.5
    good, fifo = (store.segment_path(JOB, "w", i) for i in range(2))
    columns = {
        "obs": np.zeros((3, 4), np.float32),
        "action": np.array([0, 1, 0]),
        "logp": np.zeros(3, np.float32),
        "adv": np.arange(3, dtype=np.float32),
        "ret": np.zeros(3, np.float32),
    }
    store.write_segment(good, columns, header={"policy_version": 1})
    os.mkfifo(store.resolve(fifo))
    reads_without_a_bound(store, monkeypatch)
    batch = SampledBatch(
        keys=list(range(5)),
        segments=[
            SampledSegment(path=fifo, rows=[0, 1]),
            SampledSegment(path=good, rows=[0, 1, 2]),
        ],
        weights=[1.0] * 5,
    )
    try:
        started = time.monotonic()
        round_columns, versions = learn.round_data(SampleReply(batches=[batch]))
        assert time.monotonic() - started < 5
        assert round_columns["adv"].tolist() == [0.0, 1.0, 2.0] and versions == [1]
        assert ctx.unusable_segments == {fifo}
    finally:
        end_of_file(store, fifo)


@pytest.mark.timeout(30)
def test_priorities_ride_on_the_next_sample_requests_each_sent_once(tmp_path):
    config, _ = resolve_job_config(
        {"policy": {"type": "dqn", "other": {"replay_buffer": {"type": "prioritized"}}}}
    )
    config = with_spaces(config, 4, 2)
    store = SharedStore(tmp_path)
    path = store.segment_path(JOB, "w", 0)
    rows = {
        "obs": np.zeros((8, 4), np.float32),
        "action": np.zeros(8, np.int64),
        "reward": np.ones(8, np.float32),
        "next_obs": np.zeros((8, 4), np.float32),
        "done": np.zeros(8, np.float32),
        "discount": np.full(8, 0.99, np.float32),
    }
    store.write_segment(path, rows)

    def reply(first_key):
        keys = [first_key, first_key + 1]
        segment = SampledSegment(path=path, rows=[0, 1])
        return SampleReply(batches=[SampledBatch(keys=keys, segments=[segment], weights=[1.0] * 2)])

    sampler = Sampler(reply(100))
    sampler.replies = [reply(300), reply(200), reply(100)]  # popped from the end
    ctx = TaskContext(
        task=TaskAssignment(task_id="t-1", job_id=JOB, spec=LearnSpec(seed=0)),
        worker_id="learner-1",
        coordinator=sampler,  # type: ignore[arg-type]
        data=sampler,  # type: ignore[arg-type]
        metrics=CollectorRegistry(),
    )
    learn = BatchSession(ctx, config, store, DQN(config.policy), 0)
    assert learn.run()["train_iter"] == 3
    with_requests = [k for request in sampler.requests for k in request["priority_keys"]]
    alone = [k for keys, _ in sampler.priorities for k in keys]
    # No priorities request while sampling goes on: they come with the requests. A
    # reply's priorities ride on a request that leaves after it trained: the next one
    # or the one after (the prefetch thread sends each as the reply before it starts
    # training). So the first two replies' always do; the last reply's go with the
    # last request only when its prefetch ran late, else with the task's end.
    assert {100, 101, 200, 201} <= set(with_requests)
    assert sorted(with_requests + alone) == [100, 101, 200, 201, 300, 301]
    for request in sampler.requests:
        assert len(request["priority_keys"]) == len(request["priorities"])


def test_a_request_carries_at_most_one_updates_worth_and_a_failed_one_gives_it_back(tmp_path):
    from common.messages import MAX_KEYS_PER_UPDATE

    learn = session(tmp_path)
    learn.prioritized = True
    count = MAX_KEYS_PER_UPDATE + 5
    learn.outbox.add(None, *learn.new_priorities(list(range(count)), [np.ones(count, np.float32)]))
    learn.hold_trained("hold-1")
    holds, keys, values = learn.outbox.take()
    assert holds == ["hold-1"] and keys == list(range(MAX_KEYS_PER_UPDATE))
    assert len(values) == MAX_KEYS_PER_UPDATE
    learn.outbox.give_back(holds, keys, values)  # the request failed: nothing is lost
    learn.hold_trained("hold-2")
    assert learn.outbox.take()[:2] == (["hold-1", "hold-2"], list(range(MAX_KEYS_PER_UPDATE)))
    assert learn.outbox.take() == ([], list(range(MAX_KEYS_PER_UPDATE, count)), [1.0] * 5)
