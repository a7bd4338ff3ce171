"""The n-step builder against a plain per-env reference, on random episodes."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from services.collector.step_data import NStepBuilder


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
