"""The n-step builder against a plain per-env reference, on random episodes."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from services.collector.step_data import EpisodeTracker, NStepBuilder


def reference_rows(steps: list[dict], num_envs: int, nstep: int, gamma: float) -> list[tuple]:
    """Each env's queue of pending steps, walked one env and one step at a time."""
    pending = [collections.deque() for _ in range(num_envs)]
    rows = []

    def emit(queue: collections.deque, next_obs: np.ndarray, done: bool) -> None:
        ret = sum(gamma**k * r for k, (_, _, r, _) in enumerate(queue))
        obs, action, _, mark = queue[0]
        rows.append((*obs, action, ret, *next_obs, float(done), gamma ** len(queue), mark))

    for s in steps:
        for i, queue in enumerate(pending):
            queue.append((s["obs"][i], s["action"][i], s["reward"][i], s["mark"][i]))
            if s["terminated"][i] or s["truncated"][i]:
                while queue:
                    emit(queue, s["next_obs"][i], bool(s["terminated"][i]))
                    queue.popleft()
            elif len(queue) == nstep:
                emit(queue, s["next_obs"][i], False)
                queue.popleft()
    return rows


@pytest.mark.parametrize(("num_envs", "nstep"), [(1, 1), (3, 2), (8, 3), (5, 5)])
def test_rows_match_the_per_env_reference(num_envs: int, nstep: int):
    rng = np.random.default_rng(num_envs * 10 + nstep)
    gamma = 0.9
    steps = [
        {
            "obs": rng.normal(size=(num_envs, 2)),
            "action": rng.integers(0, 4, num_envs),
            "reward": rng.normal(size=num_envs),
            "next_obs": rng.normal(size=(num_envs, 2)),
            "terminated": rng.random(num_envs) < 0.1,
            "truncated": rng.random(num_envs) < 0.05,
            "mark": rng.normal(size=num_envs),
        }
        for _ in range(200)
    ]
    builder = NStepBuilder(num_envs, nstep, gamma)
    taken = []
    for t, s in enumerate(steps):
        builder.add(
            s["obs"],
            s["action"],
            s["reward"],
            s["next_obs"],
            s["terminated"],
            s["truncated"],
            {"mark": s["mark"]},
        )
        if t % 7 == 6:  # takes between steps keep what is pending
            ready = len(builder)
            taken.append(builder.take())
            assert len(taken[-1]["obs"]) == ready
    taken.append(builder.take())
    cols = {k: np.concatenate([c[k] for c in taken if len(c["obs"])]) for k in taken[0]}
    got = np.column_stack(
        [
            cols["obs"],
            cols["action"],
            cols["reward"],
            cols["next_obs"],
            cols["done"],
            cols["discount"],
            cols["mark"],
        ]
    )
    want = np.array(reference_rows(steps, num_envs, nstep, gamma))
    assert got.shape == want.shape
    # The same rows, in whatever order: sort both by every column.
    order = lambda a: a[np.lexsort(a.T[::-1])]  # noqa: E731
    np.testing.assert_allclose(order(got), order(want.astype(np.float32)), rtol=1e-5, atol=1e-5)
    assert cols["action"].dtype == np.int64 and cols["mark"].dtype == np.float32


def random_episode_steps(rng: np.random.Generator, num_steps: int, num_envs: int):
    rewards = rng.normal(size=(num_steps, num_envs))
    ended = rng.random((num_steps, num_envs)) < 0.08
    return rewards, ended


def test_episodes_counted_in_blocks_match_counting_step_by_step():
    rng = np.random.default_rng(3)
    rewards, ended = random_episode_steps(rng, 400, 5)
    one_by_one, in_blocks = EpisodeTracker(5), EpisodeTracker(5)
    stepped = [ep for t in range(400) for ep in one_by_one.step(rewards[t], ended[t])]
    blocked, at = [], 0
    while at < 400:
        size = int(rng.integers(0, 30))  # empty blocks too
        blocked += in_blocks.steps(rewards[at : at + size], ended[at : at + size])
        at += size
    assert [(env, length) for env, _, length in blocked] == [(e, n) for e, _, n in stepped]
    np.testing.assert_allclose([r for _, r, _ in blocked], [r for _, r, _ in stepped], atol=1e-9)
    taken, want = in_blocks.take(), one_by_one.take()
    np.testing.assert_allclose(taken[0], want[0], atol=1e-9)
    assert taken[1] == want[1]
    # What is still running carries on the same way.
    last_blocked = in_blocks.steps(np.ones((1, 5)), np.ones((1, 5), dtype=bool))
    last_stepped = one_by_one.step(np.ones(5), np.ones(5, dtype=bool))
    assert [(e, n) for e, _, n in last_blocked] == [(e, n) for e, _, n in last_stepped]
    np.testing.assert_allclose([r for _, r, _ in last_blocked], [r for _, r, _ in last_stepped])


def test_fresh_steps_give_every_step_once_across_takes():
    rng = np.random.default_rng(4)
    num_envs, nstep = 4, 3
    rewards, ended = random_episode_steps(rng, 120, num_envs)
    terminated = ended & (rng.random(ended.shape) < 0.5)
    truncated = ended & ~terminated
    builder = NStepBuilder(num_envs, nstep, 0.9)
    seen_rewards, seen_ended = [], []
    for t in range(120):
        obs = rng.normal(size=(num_envs, 2))
        builder.add(obs, rng.integers(0, 2, num_envs), rewards[t], obs, terminated[t], truncated[t])
        if rng.random() < 0.2:  # a take now and then, each asking for the fresh steps first
            fresh_rewards, fresh_ended = builder.fresh_steps()
            seen_rewards.append(fresh_rewards)
            seen_ended.append(fresh_ended)
            builder.take()
    fresh_rewards, fresh_ended = builder.fresh_steps()
    np.testing.assert_array_equal(np.concatenate([*seen_rewards, fresh_rewards]), rewards)
    np.testing.assert_array_equal(np.concatenate([*seen_ended, fresh_ended]), ended)
    assert builder.fresh_steps()[0].shape == (0, num_envs)
