"""How a collector's vector steps become step data: episode returns and lengths for
every loop, the n-step transitions of the `transitions` loop, and a `rounds` loop's
round as training columns with its GAE advantages and returns (`round_columns`).

Each transition row is::

    obs, action, reward = sum_k gamma^k r_{t+k}, next_obs = o_{t+m},
    done = episode terminated within the m steps, discount = gamma^m   (m <= nstep)

so a learner's target is ``reward + discount * (1 - done) * Q_target(next_obs, a*)``.
A time-limit truncation is not `done`: the learner bootstraps from the last state.
"""

from __future__ import annotations

import collections

import numpy as np

from common.advantages import gae
from common.config import PolicyConfig
from common.messages import MAX_EPISODES_PER_SEGMENT


def as_obs(array: np.ndarray) -> np.ndarray:
    """Observations as step data stores them: uint8 images stay uint8 (a quarter of
    float32's bytes, and frames dedupe: common/frames.py); anything else is float32."""
    array = np.asarray(array)
    return array if array.dtype == np.uint8 else array.astype(np.float32)


class EpisodeTracker:
    """Returns and lengths of the episodes a vector env finishes."""

    def __init__(self, num_envs: int) -> None:
        self._return = np.zeros(num_envs)
        self._length = np.zeros(num_envs, dtype=np.int64)
        self._returns: list[float] = []
        self._lengths: list[int] = []

    def step(self, rewards: np.ndarray, ended: np.ndarray) -> list[tuple[int, float, int]]:
        """Count one vector step; returns (env, return, length) of each episode it ended."""
        self._return += rewards
        self._length += 1
        finished = [
            (int(i), float(self._return[i]), int(self._length[i])) for i in np.flatnonzero(ended)
        ]
        for i, ret, length in finished:
            self._returns.append(ret)
            self._lengths.append(length)
            self._return[i], self._length[i] = 0.0, 0
        return finished

    def take(self) -> tuple[list[float], list[int]]:
        """The episodes finished since the last call: the last MAX_EPISODES_PER_SEGMENT
        of them, as many as a segment reference lists (the coordinator keeps the last
        100 returns of a job, so the older ones would be dropped there)."""
        keep = MAX_EPISODES_PER_SEGMENT
        out = (self._returns[-keep:], self._lengths[-keep:])
        self._returns, self._lengths = [], []
        return out


_NO_EXTRAS: dict[str, np.ndarray] = {}


class NStepBuilder:
    """Turns a vector env's steps into n-step transitions, one queue per env."""

    COLUMNS = ("obs", "action", "reward", "next_obs", "done", "discount")

    def __init__(self, num_envs: int, nstep: int, gamma: float) -> None:
        self.nstep = nstep
        self.gamma = gamma
        self._pending: list[collections.deque] = [collections.deque() for _ in range(num_envs)]
        self._rows: dict[str, list] = {c: [] for c in self.COLUMNS}

    def __len__(self) -> int:
        return len(self._rows["obs"])

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        extras: dict[str, np.ndarray] | None = None,
    ) -> None:
        """One vector step; `next_obs` holds the true next observation, also at an
        episode's end (not the first observation of the next episode). `extras`: the
        actor's own columns at this step (one row per env), kept with the transition
        that starts here."""
        for i, pending in enumerate(self._pending):
            # Most algorithms' actors record nothing: no per-env dict for them.
            row = {k: v[i] for k, v in extras.items()} if extras else _NO_EXTRAS
            pending.append((obs[i], actions[i], float(rewards[i]), row))
            if terminated[i] or truncated[i]:
                while pending:
                    self._emit(pending, next_obs[i], bool(terminated[i]))
                    pending.popleft()
            elif len(pending) == self.nstep:
                self._emit(pending, next_obs[i], False)
                pending.popleft()

    def _emit(self, pending: collections.deque, next_obs: np.ndarray, done: bool) -> None:
        ret = 0.0
        for k, (_, _, reward, _) in enumerate(pending):
            ret += self.gamma**k * reward
        first_obs, action, _, extras = pending[0]
        rows = self._rows
        for name, value in extras.items():
            rows.setdefault(name, []).append(value)
        rows["obs"].append(first_obs)
        rows["action"].append(action)
        rows["reward"].append(ret)
        rows["next_obs"].append(next_obs)
        rows["done"].append(done)
        rows["discount"].append(self.gamma ** len(pending))

    def take(self) -> dict[str, np.ndarray]:
        """All finished transitions as column arrays; the builder keeps the rest."""
        rows, self._rows = self._rows, {c: [] for c in self.COLUMNS}
        extras = {
            name: np.asarray(values, dtype=np.float32)
            for name, values in rows.items()
            if name not in self.COLUMNS
        }
        return extras | {
            "obs": as_obs(rows["obs"]),
            # discrete: action ids; continuous: actions normalized to [-1, 1]
            "action": np.asarray(rows["action"]).astype(
                np.float32 if np.asarray(rows["action"]).dtype.kind == "f" else np.int64
            ),
            "reward": np.asarray(rows["reward"], dtype=np.float32),
            "next_obs": as_obs(rows["next_obs"]),
            "done": np.asarray(rows["done"], dtype=np.float32),
            "discount": np.asarray(rows["discount"], dtype=np.float32),
        }


ROUND_COLUMNS = (
    "obs",
    "action",
    "logp",
    "value",
    "reward",
    "terminated",
    "ended",
    "next_value",
)


def round_columns(record: dict[str, list], config: PolicyConfig) -> dict[str, np.ndarray]:
    """One round's [T, num_envs] records as flat training columns with GAE."""
    arrays = {k: np.asarray(v) for k, v in record.items()}
    adv, ret = gae(
        arrays["reward"].astype(np.float32),
        arrays["value"].astype(np.float32),
        arrays["next_value"].astype(np.float32),
        arrays["terminated"].astype(np.float32),
        arrays["ended"].astype(np.float32),
        config.discount_factor,
        config.collect.gae_lambda,
    )

    def flat(a: np.ndarray) -> np.ndarray:
        return a.reshape(a.shape[0] * a.shape[1], *a.shape[2:])

    action = flat(arrays["action"])
    extras = {k: flat(a).astype(np.float32) for k, a in arrays.items() if k not in ROUND_COLUMNS}
    return extras | {
        "obs": as_obs(flat(arrays["obs"])),
        "action": action.astype(np.float32 if action.dtype.kind == "f" else np.int64),
        "logp": flat(arrays["logp"]).astype(np.float32),
        "adv": flat(adv).astype(np.float32),
        "ret": flat(ret).astype(np.float32),
    }
