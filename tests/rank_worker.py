"""Ranks of a learner group under test: ``python -m tests.rank_worker OUT SCENARIO...``.

tests/unit/test_learner_group.py starts one of these per rank with the variables
torchrun sets (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`). Each
joins the group as a learner's ranks do (`RankGroup.join`, gloo on CPU) and runs the
scenarios in order (a scenario with an argument is written `name:arg`), each writing
what it saw into its own folder `OUT/name-arg`, named by rank: learner states as
`.safetensors`, everything else as JSON. Nothing is pickled. What a scenario needs from
the test (the shared root with the segment files the test wrote, a batch) is in that
folder's `spec.json`.

The scenarios share one launch because starting a rank is most of the cost (importing
torch, and torch._dynamo with the first optimizer, takes seconds a process); training
on the small networks here takes well under a second a scenario.

The helpers above the scenarios (configs, fabricated batches, flattened states) are
imported by the test too, so the ranks and the test's single-process reference train
on the very same data.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from algorithms.registry import ALGORITHMS
from algorithms.sync import LOCAL
from common.config import JobConfig
from common.messages import SampledBatch, parse
from common.storage import SharedStore
from jobconfig import resolve_job_config, sequence_length_of, with_spaces
from services.learner.aggregator import follow_task
from services.learner.group import RankEnv, RankGroup, share_bounds
from services.learner.segments import VALID, SegmentCache, SegmentSchema
from services.learner.training import Trainer, new_learner

JOB = "job-1"
SEED = 0
OBS, ACTIONS = 4, 2
#: Items of each global batch (DQN transitions, IMPALA unrolls, SAC transitions).
GLOBAL_BATCH = 32
#: Updates each rank takes in the scenario `learn` (SAC's three optimizers make it the
#: slowest per update, and no single-process reference needs its 50).
UPDATES = {"dqn": 50, "impala": 50, "sac": 20, "r2d2": 20}
#: A PPO round (n_sample items) and its global minibatch.
PPO_ROUND, PPO_MINIBATCH = 64, 16
PPO_ROUNDS = 2
#: The values the ranks standardize together (an odd count: unequal shares).
NORMALIZED = 37
#: The messages rank 0 sends in the scenario `messages`, in order.
MESSAGES: list[dict[str, Any]] = [
    {"kind": "idle"},
    {},
    {"kind": "task", "job_id": JOB, "seed": 7, "checkpoint": None, "policy": None},
    {"text": 'ünïcödé ✓ "quoted" \\ \n', "numbers": [0, -1, 2.5, 1e-300, True, None]},
    {"kind": "batches", "batches": [{"keys": list(range(5000)), "weights": [0.5] * 5000}]},
]


# --- what the ranks and the test share ---------------------------------------------


def config_of(algo: str) -> JobConfig:
    """A small job of `algo` (small networks: the machine running the tests has two
    cores), with its spaces filled in."""
    raw: dict[str, Any] = {
        "policy": {
            "type": algo,
            "model": {"encoder_hidden_size_list": [32, 32]},
            "learn": {"batch_size": GLOBAL_BATCH},
        }
    }
    if algo == "impala":
        raw["policy"]["collect"] = {"unroll_len": 4}
    if algo == "r2d2":  # short sequences: burn-in 1, 5 learned steps
        raw["policy"] |= {"burnin_step": 1, "unroll_len": 5, "nstep": 2}
        raw["policy"]["model"]["lstm_hidden_size"] = 16
        raw["policy"]["other"] = {"replay_buffer": {"sequence_length": 6, "overlap": 3}}
    if algo == "ppo":
        raw["policy"]["learn"] = {"batch_size": PPO_MINIBATCH, "epoch_per_collect": 2}
        raw["policy"]["collect"] = {"n_sample": PPO_ROUND}
        # Running statistics the ranks must add up alike (algorithms/normalize.py).
        raw["policy"]["normalize"] = {"obs": True, "reward": True}
    config, _ = resolve_job_config(raw)
    if algo == "sac":
        return with_spaces(config, OBS, ACTIONS, "continuous", ([-1.0] * ACTIONS, [1.0] * ACTIONS))
    return with_spaces(config, OBS, ACTIONS)


def fabricate(config: JobConfig, rows: int, seed: int) -> dict[str, np.ndarray]:
    """`rows` rows of the columns the job's algorithm reads, random but valid for the
    learner's segment checks (an IMPALA row is an unroll: time axis included)."""
    rng = np.random.default_rng(seed)
    schema = SegmentSchema.for_policy(
        config.policy, ALGORITHMS[config.policy.type].column_names_for(config.policy)
    )
    columns: dict[str, np.ndarray] = {}
    for name, spec in schema.columns.items():
        shape = (rows, *spec.shape)
        if spec.kind == "index":
            columns[name] = rng.integers(0, spec.high, shape)
        elif spec.kind == "flag":
            columns[name] = (rng.random(shape) < 0.1).astype(spec.dtype)
        elif name == "logp":  # a behaviour policy's log-probabilities: at most 0
            columns[name] = -rng.uniform(0.1, 2.0, shape).astype(spec.dtype)
        elif name == "discount":  # gamma ** steps taken
            columns[name] = rng.uniform(0.9, 1.0, shape).astype(spec.dtype)
        else:
            columns[name] = rng.uniform(-1.0, 1.0, shape).astype(spec.dtype)
    columns = schema.check(columns)
    steps = sequence_length_of(config)
    if steps is None:
        return columns
    # Sequence items (R2D2): each row's values along a time axis, the ends padding.
    sequences = {k: np.repeat(v[:, None], steps, axis=1) for k, v in columns.items()}
    lengths = rng.integers(2, steps + 1, rows)
    return sequences | {VALID: (np.arange(steps)[None] < lengths[:, None]).astype(np.float32)}


def global_batches(config: JobConfig, count: int) -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """`count` fixed global batches of `GLOBAL_BATCH` items with their (uneven)
    importance weights."""
    batches = []
    for i in range(count):
        weights = np.random.default_rng(1000 + i).uniform(0.5, 1.5, GLOBAL_BATCH)
        batches.append((fabricate(config, GLOBAL_BATCH, seed=i), weights.astype(np.float32)))
    return batches


def rows_of(columns: dict[str, np.ndarray], start: int, stop: int) -> dict[str, np.ndarray]:
    return {name: column[start:stop] for name, column in columns.items()}


def normalize_input() -> np.ndarray:
    """The values of the scenario `ppo`'s normalization check (not centred, not unit)."""
    return np.random.default_rng(7).normal(3.0, 5.0, NORMALIZED).astype(np.float32)


def flat_state(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """A learner's (nested) state dict as flat, dotted names of tensors, numbers
    included (an optimizer's step, a learning rate, `train_iter`), for safetensors."""
    if isinstance(state, torch.Tensor):
        return {prefix: state.detach().to("cpu").clone().contiguous()}
    if isinstance(state, bool | int | float):
        return {prefix: torch.tensor(state)}
    if isinstance(state, dict):
        items = state.items()
    elif isinstance(state, list | tuple):
        items = enumerate(state)
    else:
        return {}
    flat: dict[str, torch.Tensor] = {}
    for key, value in items:
        flat.update(flat_state(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


# --- the scenarios -----------------------------------------------------------------


def save_learner(out: Path, name: str, learner: Any) -> None:
    """The learner's whole state and its skip count, as OUT/NAME.safetensors."""
    tensors = flat_state(learner.state_dict())
    tensors["skipped_updates"] = torch.tensor(learner.skipped_updates)
    save_file(tensors, str(out / f"{name}.safetensors"))


def write_json(out: Path, name: str, value: Any) -> None:
    (out / f"{name}.json").write_text(json.dumps(value))


def read_spec(out: Path) -> dict[str, Any]:
    return json.loads((out / "spec.json").read_text())


def learn(group: RankGroup, out: Path, algo: str) -> None:
    """Each rank trains on its share of the same fixed global batches, through the
    learner's own `learn_batch`, as `Trainer.train_batch` calls it."""
    config = config_of(algo)
    learner = new_learner(config, SEED, group)
    group.broadcast_state(learner.state_dict())  # as LearnerRunner.learn does
    save_learner(out, f"initial-{group.rank}", learner)
    for columns, weights in global_batches(config, UPDATES[algo]):
        start, stop = share_bounds(len(weights), group.rank, group.world_size)
        learner.learn_batch(rows_of(columns, start, stop), weights[start:stop])
    save_learner(out, f"rank-{group.rank}", learner)


def ppo(group: RankGroup, out: Path) -> None:
    """PPO rounds as a learner group's ranks run them: each reads its share of the
    round from the segment files (`round_share`) and trains on it (`train_round`);
    then each standardizes its share of `normalize_input()` with the group."""
    spec = read_spec(out)
    config = config_of("ppo")
    learner = new_learner(config, SEED, group)
    group.broadcast_state(learner.state_dict())
    schema = SegmentSchema.for_policy(
        config.policy, ALGORITHMS["ppo"].column_names_for(config.policy)
    )
    trainer = Trainer(learner, SegmentCache(SharedStore(spec["root"]), JOB, schema), group)
    batch = parse(SampledBatch, spec["batch"])
    rows = []
    for _ in range(PPO_ROUNDS):
        columns = trainer.round_share(batch)
        rows.append(len(columns["obs"]))
        trainer.train_round(columns)
    save_learner(out, f"rank-{group.rank}", learner)

    values = normalize_input()
    start, stop = share_bounds(len(values), group.rank, group.world_size)
    normalized = learner.sync.normalize(torch.as_tensor(values[start:stop]))
    save_file(
        {"normalized": normalized.contiguous()}, str(out / f"normalized-{group.rank}.safetensors")
    )
    write_json(out, f"rows-{group.rank}", rows)


def nan(group: RankGroup, out: Path) -> None:
    """DQN updates where one rank's loss is NaN (a NaN reward): a good update, one
    poisoned on rank 1, one poisoned on rank 0, and a good one again; the state is
    saved after each."""
    config = config_of("dqn")
    learner = new_learner(config, SEED, group)
    group.broadcast_state(learner.state_dict())
    poisoned_rank = [None, 1, 0, None]
    batches = global_batches(config, len(poisoned_rank))
    for step, ((columns, weights), poisoned) in enumerate(zip(batches, poisoned_rank, strict=True)):
        start, stop = share_bounds(len(weights), group.rank, group.world_size)
        mine = rows_of(columns, start, stop)
        if poisoned == group.rank:
            mine["reward"] = np.full_like(mine["reward"], np.nan)
        learner.learn_batch(mine, weights[start:stop])
        save_learner(out, f"step-{step}-rank-{group.rank}", learner)


def priorities(group: RankGroup, out: Path) -> None:
    """`Trainer.train_batch` on one sampled global batch, once per case of
    `spec["cases"]`; a case names segments that are unusable on rank 1 only (its
    cache lists them as unusable before it reads anything). Each rank records the
    |TD errors| its own learner returned; rank 0 the merged outcome."""
    spec = read_spec(out)
    config = config_of("dqn")
    learner = new_learner(config, SEED, group)
    group.broadcast_state(learner.state_dict())
    trained: list[list[float]] = []
    scalars: list[dict[str, float]] = []
    learn_batch = learner.learn_batch

    def recording(columns: dict[str, np.ndarray], weights: np.ndarray) -> Any:
        info = learn_batch(columns, weights)
        trained.append(np.asarray(info.td_abs).tolist())
        scalars.append(dict(info.scalars))
        return info

    learner.learn_batch = recording  # type: ignore[method-assign]
    schema = SegmentSchema.for_policy(
        config.policy, ALGORITHMS["dqn"].column_names_for(config.policy)
    )
    store = SharedStore(spec["root"])
    batch = parse(SampledBatch, spec["batch"])
    results = []
    for case in spec["cases"]:
        unusable = set(case["unusable_on_rank_1"]) if group.rank == 1 else set()
        trainer = Trainer(learner, SegmentCache(store, JOB, schema, unusable=unusable), group)
        trained.clear()
        scalars.clear()
        outcome = trainer.train_batch(batch)
        result: dict[str, Any] = {
            "trained_td": trained[0] if trained else None,
            "scalars": scalars[0] if scalars else None,
            "train_iter": learner.train_iter,
        }
        if group.rank == 0:
            result["outcome"] = (
                None
                if outcome is None
                else {
                    "keys": outcome.keys,
                    "td_abs": outcome.td_abs.tolist(),
                    "scalars": outcome.scalars,
                }
            )
        results.append(result)
    write_json(out, f"rank-{group.rank}", results)


def messages(group: RankGroup, out: Path) -> None:
    """Rank 0 sends `MESSAGES` and the others write down what they received; then
    learners seeded differently on each rank, each after one step of its own (so the
    optimizers hold moments), are made equal with `broadcast_state`."""
    if group.rank == 0:
        sent = [group.send(message) for message in MESSAGES]
        write_json(out, "rank-0", sent)
    else:
        write_json(out, f"rank-{group.rank}", [group.receive() for _ in MESSAGES])

    config = config_of("dqn")
    learner = new_learner(config, SEED + 1 + group.rank, None)
    assert learner.sync is LOCAL  # this step is the rank's own: nothing to agree on
    (columns, weights), *_ = global_batches(config, 1)
    start, stop = share_bounds(len(weights), group.rank, group.world_size)
    learner.learn_batch(rows_of(columns, start, stop), weights[start:stop])
    save_learner(out, f"before-{group.rank}", learner)
    group.broadcast_state(learner.state_dict())
    save_learner(out, f"after-{group.rank}", learner)


def follower_failure(group: RankGroup, out: Path) -> None:
    """A task that fails on rank 1 alone (its job's files are not there): rank 1 drops
    it and waits for rank 0's `end`, and then follows rank 0's next message."""
    task = {"kind": "task", "job_id": "job-gone", "seed": 0, "checkpoint": None, "policy": None}
    if group.rank == 0:
        group.send(task)
        group.send({"kind": "batch", "batch": {}})  # what rank 1 must skip while waiting
        group.send({"kind": "end"})
        group.send({"kind": "probe"})
        return
    follow_task(group, SharedStore(out), group.receive())
    write_json(out, "rank-1", group.receive())


SCENARIOS: dict[str, Callable[..., None]] = {
    "learn": learn,
    "ppo": ppo,
    "nan": nan,
    "priorities": priorities,
    "messages": messages,
    "follower_failure": follower_failure,
}


def main(argv: list[str]) -> int:
    out, *scenarios = argv
    torch.set_num_threads(1)  # the ranks share two cores: one thread each
    ranks = RankEnv.from_env()
    assert ranks is not None, "WORLD_SIZE must be 2 or more"
    group = RankGroup.join(ranks, collective_timeout_s=60)
    try:
        for scenario in scenarios:
            name, _, arg = scenario.partition(":")
            folder = Path(out) / scenario.replace(":", "-")
            folder.mkdir(parents=True, exist_ok=True)
            print(f"rank {group.rank}: {scenario}", flush=True)  # where a failure happened
            SCENARIOS[name](group, folder, *([arg] if arg else []))
    finally:
        group.close()
    print(f"rank {group.rank}: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
