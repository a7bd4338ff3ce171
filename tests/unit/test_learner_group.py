"""A learner group trains one job as one learner: its ranks stay bitwise identical,
train as one process would on the global batches, skip together, and report every
sampled item exactly once.

The group tests start two real ranks (`python -m tests.rank_worker`, gloo on CPU, the
variables torchrun sets) once for the module, running every scenario in one launch:
starting a rank costs seconds of imports, training here well under one. Each rank
writes what it saw into a folder per scenario (safetensors and JSON; nothing is
pickled), which the tests read. The unit tests at the end need no processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from algorithms.normalize import PRIOR_COUNT
from algorithms.sync import LocalSync
from common.messages import SampledBatch, SampledSegment, dump
from common.storage import SharedStore
from drover.local import free_port
from jobconfig import resolve_job_config
from jobconfig.ranks import split_error
from services.learner.group import share_bounds, share_of
from services.learner.training import new_learner
from tests.rank_worker import (
    JOB,
    MESSAGES,
    PPO_ROUND,
    PPO_ROUNDS,
    SEED,
    UPDATES,
    config_of,
    fabricate,
    flat_state,
    global_batches,
    normalize_input,
)

ROOT = Path(__file__).resolve().parents[2]
WORLD_SIZE = 2
#: How long the ranks may take for every scenario together (they take about 20 s).
TIMEOUT_S = 120.0
#: What the module's launch runs, in order (see tests/rank_worker.py).
SCENARIOS = [
    "learn:dqn",
    "learn:impala",
    "learn:sac",
    "learn:r2d2",
    "ppo",
    "nan",
    "priorities",
    "messages",
    "follower_failure",
]
#: Counters that change on every update, stepped or skipped.
COUNTERS = {"train_iter", "skipped_updates"}


# --- starting the ranks ------------------------------------------------------------


def start_ranks(out: Path, scenarios: list[str], port: int) -> list[subprocess.Popen]:
    """One process per rank, each with its own log file (a pipe could fill up and
    block a rank while the test waits on another)."""
    procs = []
    for rank in range(WORLD_SIZE):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(WORLD_SIZE),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        with open(out / f"rank-{rank}.log", "w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tests.rank_worker", str(out), *scenarios],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    return procs


def wait_ranks(procs: list[subprocess.Popen], timeout_s: float) -> str | None:
    """Wait for every rank to exit; why not, if one failed or the time ran out. A rank
    that fails leaves the others waiting in a collective: they are not waited for."""
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [proc.poll() for proc in procs]
        if any(code not in (None, 0) for code in codes):
            return f"exit codes {codes}"
        if all(code == 0 for code in codes):
            return None
        if time.monotonic() > deadline:
            return f"still running after {timeout_s:.0f} s (exit codes {codes})"
        time.sleep(0.1)


def run_ranks(out: Path, scenarios: list[str], timeout_s: float = TIMEOUT_S) -> None:
    """Run the scenarios on a group of `WORLD_SIZE` ranks; fails the test, showing each
    rank's output, unless every rank finished them."""
    for attempt in range(2):
        procs = start_ranks(out, scenarios, free_port())
        try:
            failure = wait_ranks(procs, timeout_s)
        finally:
            for proc in procs:  # only these processes, which this test started
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
        if failure is None:
            return
        logs = [(out / f"rank-{rank}.log").read_text() for rank in range(WORLD_SIZE)]
        # The free port can be taken between finding it and rank 0 binding it: retry.
        if attempt == 0 and any("address already in use" in log.lower() for log in logs):
            continue
        shown = "\n".join(f"--- rank {rank} ---\n{log[-6000:]}" for rank, log in enumerate(logs))
        pytest.fail(f"the ranks failed: {failure}\n{shown}", pytrace=False)


# --- what the tests give the ranks, and read back ------------------------------------


@dataclass
class GroupRun:
    """The folder of a finished launch, and the inputs the test wrote for it."""

    out: Path
    #: The sampled batch of the scenario `priorities`, and its segments' paths.
    batch: SampledBatch
    segments: list[str]

    def state(self, scenario: str, name: str) -> dict[str, torch.Tensor]:
        return load_file(str(self.out / scenario / f"{name}.safetensors"))

    def ranks(self, scenario: str, name: str = "rank") -> list[dict[str, torch.Tensor]]:
        """`name-0`, `name-1`, ...: a state file of every rank."""
        return [self.state(scenario, f"{name}-{rank}") for rank in range(WORLD_SIZE)]

    def json(self, scenario: str, name: str) -> Any:
        return json.loads((self.out / scenario / f"{name}.json").read_text())


def write_spec(out: Path, scenario: str, spec: dict[str, Any]) -> None:
    folder = out / scenario
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.json").write_text(json.dumps(spec))


def ppo_round(store: SharedStore) -> SampledBatch:
    """A PPO round of `PPO_ROUND` items in two segment files, the share boundary inside
    the first."""
    config = config_of("ppo")
    sizes = [40, PPO_ROUND - 40]
    segments = []
    for seq, rows in enumerate(sizes):
        path = store.segment_path(JOB, "collector-ppo", seq)
        store.write_segment(path, fabricate(config, rows, seed=seq))
        segments.append(SampledSegment(path=path, rows=list(range(rows))))
    return SampledBatch(keys=list(range(PPO_ROUND)), segments=segments, weights=[1.0] * PPO_ROUND)


def sampled_batch(store: SharedStore) -> tuple[SampledBatch, list[str]]:
    """A DQN batch of 12 items from three segments, as a buffer samples them (rows out
    of order, uneven weights); the middle segment straddles the ranks' shares (items
    0-5 and 6-11). Item keys are 1000 * (segment + 1) + row."""
    config = config_of("dqn")
    paths = [store.segment_path(JOB, "collector-1", seq) for seq in range(3)]
    picks = [[0, 2, 4], [1, 3, 5, 7, 0], [4, 1, 2, 0]]
    for seq, (path, rows) in enumerate(zip(paths, [6, 8, 5], strict=True)):
        store.write_segment(path, fabricate(config, rows, seed=100 + seq))
    keys = [1000 * (seq + 1) + row for seq, rows in enumerate(picks) for row in rows]
    weights = np.random.default_rng(3).uniform(0.5, 1.5, len(keys)).tolist()
    segments = [SampledSegment(path=p, rows=r) for p, r in zip(paths, picks, strict=True)]
    return SampledBatch(keys=keys, segments=segments, weights=weights), paths


@pytest.fixture(scope="module")
def group_run(tmp_path_factory: pytest.TempPathFactory) -> GroupRun:
    """Every scenario, run once on a group of two ranks."""
    out = tmp_path_factory.mktemp("group")
    root = tmp_path_factory.mktemp("shared")
    store = SharedStore(root)
    write_spec(out, "ppo", {"root": str(root), "batch": dump(ppo_round(store))})
    batch, paths = sampled_batch(store)
    # 0: every segment usable; 1: the straddling one unusable on rank 1 only; 2: every
    # segment of rank 1's share unusable there.
    cases = [[], [paths[1]], [paths[1], paths[2]]]
    spec = {
        "root": str(root),
        "batch": dump(batch),
        "cases": [{"unusable_on_rank_1": c} for c in cases],
    }
    write_spec(out, "priorities", spec)
    run_ranks(out, SCENARIOS)
    return GroupRun(out=out, batch=batch, segments=paths)


def assert_identical(states: list[dict[str, torch.Tensor]]) -> None:
    """Every rank's state holds the same names and, bit for bit, the same values."""
    first, *others = states
    for other in others:
        assert sorted(other) == sorted(first)
        different = [k for k in first if not torch.equal(first[k], other[k])]
        assert different == [], f"ranks differ in {different}"


def changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], prefix: str) -> bool:
    return any(not torch.equal(before[k], after[k]) for k in before if k.startswith(prefix))


# --- two ranks are one learner ---------------------------------------------------------


@pytest.mark.torchrun
@pytest.mark.parametrize("algo", ["dqn", "impala", "r2d2"])
def test_two_ranks_train_as_one_process_on_the_global_batches(group_run, algo):
    """Each rank trains on its half of the same 50 global batches: networks and
    optimizer moments stay bitwise identical across the ranks, and equal (up to float
    rounding of the averaged gradients) to one process trained on the whole batches."""
    ranks = group_run.ranks(f"learn-{algo}")
    assert_identical(ranks)
    trained = ranks[0]
    assert int(trained["train_iter"]) == UPDATES[algo] and int(trained["skipped_updates"]) == 0
    assert changed(group_run.state(f"learn-{algo}", "initial-0"), trained, "online.")

    config = config_of(algo)
    alone = new_learner(config, SEED, None)
    for columns, weights in global_batches(config, UPDATES[algo]):
        alone.learn_batch(columns, weights)
    reference = flat_state(alone.state_dict())
    assert sorted(reference) == sorted(set(trained) - {"skipped_updates"})
    for name, value in reference.items():
        if value.is_floating_point():  # moments and step counts too
            diff = float((trained[name] - value).abs().max())
            assert diff <= 1e-5, f"{name} differs from one process by {diff}"
        else:
            assert torch.equal(trained[name], value), name


@pytest.mark.torchrun
def test_sac_ranks_stay_identical_and_share_one_temperature(group_run):
    """SAC's three optimizers (critics, actor, temperature `log_alpha`) all average
    across the ranks: after its updates every rank holds the same state, though each
    sampled its own actions."""
    ranks = group_run.ranks("learn-sac")
    assert_identical(ranks)
    initial, trained = group_run.state("learn-sac", "initial-0"), ranks[0]
    assert int(trained["train_iter"]) == UPDATES["sac"] and int(trained["skipped_updates"]) == 0
    for part in ("online.", "critic.", "log_alpha"):  # each has actually been trained
        assert changed(initial, trained, part), part
    assert "optimizers.2.state.0.exp_avg" in trained  # the temperature's Adam moments


@pytest.mark.torchrun
def test_ppo_ranks_stay_identical_over_rounds(group_run):
    """PPO ranks read their halves of a round from the segment files and train on them
    with advantages normalized over the global minibatch: they end identical, having
    taken the same number of steps."""
    ranks = group_run.ranks("ppo")
    assert_identical(ranks)
    config = config_of("ppo")
    learn = config.policy.learn
    share = PPO_ROUND // WORLD_SIZE
    steps = PPO_ROUNDS * learn.epoch_per_collect * share // (learn.batch_size // WORLD_SIZE)
    assert int(ranks[0]["train_iter"]) == steps and int(ranks[0]["skipped_updates"]) == 0
    fresh = flat_state(new_learner(config, SEED, None).state_dict())
    assert changed(fresh, ranks[0], "online.")
    for rank in range(WORLD_SIZE):
        assert group_run.json("ppo", f"rows-{rank}") == [share] * PPO_ROUNDS
    # Each rank added its half of every round to the running statistics, and holds
    # those of every row (`policy.normalize`): the same on both, as assert_identical says.
    for norm in ("obs_norm", "return_norm"):
        count = float(ranks[0][f"online.{norm}.count"])
        assert count == pytest.approx(PPO_ROUNDS * PPO_ROUND + PRIOR_COUNT)


@pytest.mark.torchrun
def test_normalize_over_ranks_equals_normalize_over_the_whole(group_run):
    """`AllReduceSync.normalize` on two unequal halves (19 and 18 values) standardizes
    them with the statistics of the whole, as one process does."""
    halves = [group_run.state("ppo", f"normalized-{rank}")["normalized"] for rank in (0, 1)]
    assert [len(h) for h in halves] == [19, 18]
    whole = LocalSync().normalize(torch.as_tensor(normalize_input()))
    assert float((torch.cat(halves) - whole).abs().max()) <= 1e-6


@pytest.mark.torchrun
def test_a_non_finite_loss_on_one_rank_makes_every_rank_skip(group_run):
    """A NaN loss on rank 1, then on rank 0: neither rank changes a weight or a moment,
    both count the skipped update, and training then goes on identically."""
    steps = [group_run.ranks("nan", f"step-{step}-rank") for step in range(4)]
    for states in steps:
        assert_identical(states)
    for rank in range(WORLD_SIZE):
        good, *poisoned, later = (states[rank] for states in steps)
        for state in poisoned:
            assert [
                k for k in good if k not in COUNTERS and not torch.equal(good[k], state[k])
            ] == []
        assert [int(s["skipped_updates"]) for s in (good, *poisoned, later)] == [0, 1, 2, 2]
        assert [int(s["train_iter"]) for s in (good, *poisoned, later)] == [1, 2, 3, 4]
        assert changed(poisoned[-1], later, "online.")


# --- priorities: every sampled item once ------------------------------------------------


@pytest.mark.torchrun
def test_rank_0_reports_every_item_once_with_the_td_of_the_rank_that_trained_it(group_run):
    """On a batch whose segments are all usable, rank 0's outcome lists the batch's
    keys in batch order, each with the |TD error| of the rank whose share held it."""
    case = 0
    ranks = [group_run.json("priorities", f"rank-{rank}")[case] for rank in range(WORLD_SIZE)]
    outcome = ranks[0]["outcome"]
    assert outcome["keys"] == group_run.batch.keys
    assert [len(r["trained_td"]) for r in ranks] == [6, 6]
    assert outcome["td_abs"] == ranks[0]["trained_td"] + ranks[1]["trained_td"]
    # Its TensorBoard scalars: each the mean of the ranks' own; the gradient norm,
    # of the gradient averaged across the ranks, alike on both.
    mine, theirs = ranks[0]["scalars"], ranks[1]["scalars"]
    assert list(outcome["scalars"]) == list(mine) == list(theirs)
    for tag, value in outcome["scalars"].items():
        assert value == pytest.approx((mine[tag] + theirs[tag]) / 2), tag
    assert mine["optim/grad_norm"] == pytest.approx(theirs["optim/grad_norm"])
    assert mine["loss/td"] != theirs["loss/td"]  # each rank's loss is on its own share


@pytest.mark.torchrun
def test_a_segment_unusable_on_one_rank_costs_only_that_ranks_items(group_run):
    """When rank 1 cannot use the segment that straddles the shares, its items of that
    segment get no priority (no rank trained them) while rank 0's items of the same
    segment, and every other item, appear exactly once with their rank's TD error."""
    batch, straddling = group_run.batch, group_run.segments[1]
    ranks = [group_run.json("priorities", f"rank-{rank}")[1] for rank in range(WORLD_SIZE)]
    outcome = ranks[0]["outcome"]
    share = range(*share_bounds(len(batch.keys), 1, WORLD_SIZE))
    segment_of = [s.path for s in batch.segments for _ in s.rows]
    dropped = [batch.keys[i] for i in share if segment_of[i] == straddling]
    assert dropped == [2007, 2000]
    assert outcome["keys"] == [k for k in batch.keys if k not in dropped]
    assert {2001, 2003, 2005} <= set(outcome["keys"])  # rank 0 trained its part of it
    assert [len(r["trained_td"]) for r in ranks] == [6, 4]
    assert outcome["td_abs"] == ranks[0]["trained_td"] + ranks[1]["trained_td"]

    # With nothing usable on rank 1, no rank steps and rank 0 reports nothing.
    nothing = [group_run.json("priorities", f"rank-{rank}")[2] for rank in range(WORLD_SIZE)]
    assert nothing[0]["outcome"] is None and nothing[1]["trained_td"] is None
    assert nothing[0]["trained_td"] is None  # rank 0 did not train alone either
    assert [r["train_iter"] for r in nothing] == [r["train_iter"] for r in ranks]


# --- messages and the initial state -----------------------------------------------------


@pytest.mark.torchrun
def test_messages_from_rank_0_arrive_as_sent(group_run):
    """JSON messages (empty, unicode, large) cross the group in order, unchanged."""
    assert group_run.json("messages", "rank-0") == MESSAGES
    assert group_run.json("messages", "rank-1") == MESSAGES


@pytest.mark.torchrun
def test_broadcast_state_makes_every_rank_start_from_rank_0s(group_run):
    """Learners seeded differently (and stepped on different data) become rank 0's
    learner, weights and optimizer moments alike."""
    before = group_run.ranks("messages", "before")
    after = group_run.ranks("messages", "after")
    assert changed(before[0], before[1], "online.")
    assert changed(before[0], before[1], "optimizer.state.")
    for state in after:
        assert_identical([before[0], state])


# --- shares and sizes (no processes) ------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_share_bounds_split_a_batch_into_contiguous_near_equal_shares(world_size):
    """The ranks' shares cover every item once, in order, sizes differing by one at most."""
    for items in range(0, 40):
        bounds = [share_bounds(items, rank, world_size) for rank in range(world_size)]
        assert bounds[0][0] == 0 and bounds[-1][1] == items
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
        sizes = [stop - start for start, stop in bounds]
        assert min(sizes) >= 0 and max(sizes) - min(sizes) <= 1


def items_of(batch: SampledBatch) -> list[tuple]:
    """Each item of a batch as (key, weight, path, row, length)."""
    for segment in batch.segments:  # a length for each item, or none at all
        assert segment.lengths is None or len(segment.lengths) == len(segment.rows)
    places = [
        (s.path, row, s.lengths[i] if s.lengths is not None else None)
        for s in batch.segments
        for i, row in enumerate(s.rows)
    ]
    assert len(places) == len(batch.keys) == len(batch.weights)
    return [(k, w, *p) for k, w, p in zip(batch.keys, batch.weights, places, strict=True)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_share_of_keeps_keys_weights_rows_and_lengths_together(world_size):
    """A rank's share holds its items with their own key, weight, segment, row and
    length, across segment boundaries; the shares together are the batch."""
    segments = [
        SampledSegment(
            path="job-1/segments/a/00000000.safetensors", rows=[0, 5, 9], lengths=[2, 2, 3]
        ),
        SampledSegment(path="job-1/segments/a/00000001.safetensors", rows=[1], lengths=[4]),
        SampledSegment(path="job-1/segments/b/00000000.safetensors", rows=[6, 3, 4, 2]),
    ]
    batch = SampledBatch(
        keys=[10, 11, 12, 20, 30, 31, 32, 33],
        segments=segments,
        weights=[0.1 * i for i in range(1, 9)],
    )
    everything = items_of(batch)
    joined = []
    for rank in range(world_size):
        share = share_of(batch, rank, world_size)
        start, stop = share_bounds(len(batch.keys), rank, world_size)
        assert items_of(share) == everything[start:stop]
        # a share's segments are the batch's, in order, each once (none left empty)
        paths = [s.path for s in share.segments]
        assert len(set(paths)) == len(paths) and all(s.rows for s in share.segments)
        joined += items_of(share)
    assert joined == everything


def split_key(policy: dict[str, Any], ranks: int = 2) -> str | None:
    """The config key `split_error` names for a job of `policy` on `ranks` ranks."""
    config, _ = resolve_job_config({"policy": policy})
    error = split_error(config.policy, ranks)
    return None if error is None else error[0]


def test_split_error_names_the_size_that_does_not_split():
    """A job is refused a learner group whose ranks cannot take equal shares, naming
    the config key to change."""
    assert split_key({"type": "dqn", "learn": {"batch_size": 65}}) == "policy.learn.batch_size"
    assert split_key({"type": "ppo", "collect": {"n_sample": 2049}}) == "policy.collect.n_sample"
    assert split_key({"type": "ppo", "learn": {"batch_size": 65}}) == "policy.learn.batch_size"
    assert split_key({"type": "dqn", "learn": {"batch_size": 64}}) is None
    assert split_key({"type": "ppo", "collect": {"n_sample": 2048}}) is None
    assert split_key({"type": "dqn", "learn": {"batch_size": 65}}, ranks=1) is None
    assert split_key({"type": "dqn", "learn": {"batch_size": 66}}, ranks=3) is None


@pytest.mark.torchrun
def test_a_task_that_fails_on_one_rank_only_leaves_it_in_step_with_rank_0(group_run):
    """Rank 1 cannot read the task's job: it drops the task, skips rank 0's messages up
    to the task's `end`, and takes the next one (the group does not break)."""
    assert group_run.json("follower_failure", "rank-1") == {"kind": "probe"}
