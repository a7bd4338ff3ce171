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

from algorithms.base import SamplingActor
from common.advantages import gae
from common.config import PolicyConfig
from common.envs import VectorStep
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
        #: Steps counted, and the count at each env's episode's start: its length
        #: follows when it ends, without counting every env at every step.
        self._steps = 0
        self._start = np.zeros(num_envs, dtype=np.int64)
        self._returns: list[float] = []
        self._lengths: list[int] = []

    def step(self, rewards: np.ndarray, ended: np.ndarray) -> list[tuple[int, float, int]]:
        """Count one vector step; returns (env, return, length) of each episode it ended."""
        self._return += rewards
        self._steps += 1
        if not ended.any():
            return []
        finished = [
            (int(i), float(self._return[i]), self._steps - int(self._start[i]))
            for i in np.flatnonzero(ended)
        ]
        for i, ret, length in finished:
            self._returns.append(ret)
            self._lengths.append(length)
            self._return[i], self._start[i] = 0.0, self._steps
        return finished

    def steps(self, rewards: np.ndarray, ended: np.ndarray) -> list[tuple[int, float, int]]:
        """Count a block of vector steps at once (`rewards`, `ended`: [steps, num_envs]),
        as `step` would one after the other; returns the episodes it ended, in the same
        order. The transitions loop counts each take's steps so (`NStepBuilder.fresh_steps`):
        no work per step on the stepping thread."""
        count = len(rewards)
        if not count:
            return []
        # Each env's rewards summed from its open episode's start to each step of the
        # block; an episode ending at step t returned that sum, less what the env's
        # earlier episodes in the block took (`carried`).
        running = np.cumsum(rewards, axis=0, dtype=np.float64) + self._return
        carried = np.zeros_like(self._return)
        finished = []
        for t, i in zip(*np.nonzero(ended), strict=True):
            t, i = int(t), int(i)
            step = self._steps + t + 1
            ret, length = float(running[t, i] - carried[i]), step - int(self._start[i])
            finished.append((i, ret, length))
            self._returns.append(ret)
            self._lengths.append(length)
            carried[i], self._start[i] = running[t, i], step
        self._return = running[-1] - carried
        self._steps += count
        return finished

    def take(self) -> tuple[list[float], list[int]]:
        """The episodes finished since the last call: the last MAX_EPISODES_PER_SEGMENT
        of them, as many as a segment reference lists (the coordinator keeps the last
        100 returns of a job, so the older ones would be dropped there)."""
        keep = MAX_EPISODES_PER_SEGMENT
        out = (self._returns[-keep:], self._lengths[-keep:])
        self._returns, self._lengths = [], []
        return out


#: `NStepBuilder.take(where=True)`'s extra columns: each row's env, and whether its
#: step ended the episode.
ENV = "_env"
LAST = "_last"
#: An extra column the transitions loop records at each step (`NStepBuilder.add`'s
#: `extras`): the policy version that acted it. A row keeps its first step's, the
#: oldest of the steps it sums; a segment is labelled with its oldest row's.
VERSION = "_version"


class EpisodeRows:
    """Rows held by env until their episode ends, then given out with each episode's
    rows together and their spans: what episode and sequence items are cut from.

    An episode longer than `max_piece_rows` goes out in pieces of at most that many
    rows (each a span of its own: an item never crosses a piece either), so no chunk
    has to wait on an episode without end, and one piece always fits one upload. Each
    piece after the first starts with a copy of the last `overlap_rows` rows of the
    one before, as consecutive sequence items share rows within a piece: without it
    the rows around a cut would be in no item whole enough to learn them. The copies
    are rows, not env steps: the collector counts env steps as it steps.

    Usage::

        episodes.add(builder.take(where=True))
        if len(episodes) >= n_sample:
            columns, spans = episodes.take(max_rows)
    """

    def __init__(self, num_envs: int, max_piece_rows: int, overlap_rows: int = 0) -> None:
        if not 0 <= overlap_rows < max_piece_rows:
            raise ValueError(
                f"pieces of {max_piece_rows} rows cannot carry {overlap_rows} rows over: "
                "each must add a row"
            )
        self.max_piece_rows = max_piece_rows
        self.overlap_rows = overlap_rows
        #: Each env's rows since its episode (or piece) began, in order.
        self._open: list[list[dict[str, np.ndarray]]] = [[] for _ in range(num_envs)]
        self._open_rows = [0] * num_envs
        #: How many of those rows are copies carried over from the env's last piece.
        self._carried_rows = [0] * num_envs
        #: Whole episodes (and pieces), oldest first.
        self._closed: collections.deque[dict[str, np.ndarray]] = collections.deque()
        self._closed_rows = 0

    def __len__(self) -> int:
        """Rows of whole episodes (and pieces) `take` can give now."""
        return self._closed_rows

    def add(self, rows: dict[str, np.ndarray]) -> None:
        """Rows of `NStepBuilder.take(where=True)`: each env's in time order."""
        env, last = rows[ENV], rows[LAST]
        columns = {k: v for k, v in rows.items() if k not in (ENV, LAST)}
        for e in np.unique(env).tolist():
            index = np.flatnonzero(env == e)
            # Pieces of this env's rows, each but maybe the last ending its episode.
            for piece in np.split(index, np.flatnonzero(last[index]) + 1):
                if piece.size:
                    self._extend(e, {k: v[piece] for k, v in columns.items()})
                    if last[piece[-1]]:
                        self._close(e)

    def _extend(self, env: int, rows: dict[str, np.ndarray]) -> None:
        """Append rows to the env's open episode, closing it as a piece whenever it
        reaches `max_piece_rows`; the next piece starts with its last `overlap_rows`."""
        count = len(next(iter(rows.values())))
        done = 0
        while done < count:
            room = self.max_piece_rows - self._open_rows[env]
            part = {k: v[done : done + room] for k, v in rows.items()}
            taken = min(room, count - done)
            self._open[env].append(part)
            self._open_rows[env] += taken
            done += taken
            if self._open_rows[env] >= self.max_piece_rows:
                carry = self._close(env)
                if self.overlap_rows:
                    # copies: a view would keep the whole piece in memory
                    tail = {k: v[-self.overlap_rows :].copy() for k, v in carry.items()}
                    self._open[env] = [tail]
                    self._open_rows[env] = self._carried_rows[env] = self.overlap_rows

    def _close(self, env: int) -> dict[str, np.ndarray]:
        """Give out the env's open rows as one episode (or piece), and return them; an
        open piece of carried copies only is dropped (its episode ended with the piece
        before, which holds them)."""
        parts = self._open[env]
        new_rows = self._open_rows[env] - self._carried_rows[env]
        self._open[env], self._open_rows[env], self._carried_rows[env] = [], 0, 0
        if not new_rows:
            return {}
        episode = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        self._closed.append(episode)
        self._closed_rows += _rows_of(episode)
        return episode

    def take(self, max_rows: int) -> tuple[dict[str, np.ndarray], list[tuple[int, int]]]:
        """Whole episodes (and pieces), oldest first, up to `max_rows` rows (at least
        one), as columns with each one's (first row, rows)."""
        taken: list[dict[str, np.ndarray]] = []
        spans: list[tuple[int, int]] = []
        rows = 0
        while self._closed and (not taken or rows + _rows_of(self._closed[0]) <= max_rows):
            if len(spans) == MAX_EPISODES_PER_SEGMENT:
                break
            episode = self._closed.popleft()
            spans.append((rows, _rows_of(episode)))
            rows += spans[-1][1]
            taken.append(episode)
        self._closed_rows -= rows
        if not taken:
            return {}, []
        return {k: np.concatenate([e[k] for e in taken]) for k in taken[0]}, spans


def _rows_of(columns: dict[str, np.ndarray]) -> int:
    return len(next(iter(columns.values())))


class NStepBuilder:
    """Turns a vector env's steps into n-step transitions.

    A step only copies its arrays into the builder's own [steps, envs] columns: nothing
    else, since the stepping thread pays for every call it makes. `take` makes the rows
    of all the steps held at once, with array operations over those columns, so the
    stepping thread does no per-env or per-row Python work and nothing is stacked; what
    ended where, what is still owed and how many rows are ready follow from the columns
    when asked. The steps whose transitions still wait for later steps (the last
    `nstep - 1`, unless their episode ended) move to the front of the columns for the
    next `take`. Rows come out in step order, envs in order within a step.
    """

    COLUMNS = ("obs", "action", "reward", "next_obs", "done", "discount")
    #: What a step holds besides the actor's extras (`add`'s arguments, in order).
    HELD = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
    #: Steps the columns first hold; they double when full.
    FIRST_CAPACITY = 64

    def __init__(self, num_envs: int, nstep: int, gamma: float) -> None:
        self.num_envs = num_envs
        self.nstep = nstep
        self.gamma = gamma
        #: Steps held, by column: [capacity, num_envs, ...], the first `_count` in use;
        #: made at the first step, with its arrays' shapes and dtypes.
        self._held: dict[str, np.ndarray] = {}
        self._capacity = 0
        #: Per held step, which envs' transitions starting there are still owed: set by
        #: `take` for the steps it keeps; every row after those is True (all owed).
        self._owed = np.ones((0, num_envs), dtype=bool)
        self._count = 0
        #: Held steps `fresh_steps` has not given out yet start here.
        self._fresh = 0
        #: Transitions begun and not taken yet, complete or not.
        self._begun = 0

    def __len__(self) -> int:
        """Transitions `take` would give now: those begun, less each env's last
        `nstep - 1` or fewer (the steps since its episode's end), which wait for more.
        Those steps are always held (`take` keeps the last `nstep - 1`)."""
        window = min(self.nstep - 1, self._count)
        if not window:
            return self._begun
        recent = self._ended(self._count - window, self._count)[::-1]
        # Steps after each env's last end in the window (all of them where none).
        waiting = np.where(recent.any(axis=0), recent.argmax(axis=0), window)
        return self._begun - int(waiting.sum())

    @property
    def begun(self) -> int:
        """Transitions begun and not taken: at least `len(self)`, and cheaper to ask."""
        return self._begun

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
        actor's own columns at this step (one row per env, the same names at every
        step), kept with the transition that starts here. The arrays are copied: the
        caller may reuse them."""
        if self._count == self._capacity:
            step = (obs, actions, rewards, next_obs, terminated, truncated)
            self._grow(dict(zip(self.HELD, step, strict=True)) | (extras or {}))
        at = self._count
        held = self._held
        held["obs"][at] = obs
        held["action"][at] = actions
        held["reward"][at] = rewards
        held["next_obs"][at] = next_obs
        held["terminated"][at] = terminated
        held["truncated"][at] = truncated
        if extras:
            for name, column in extras.items():
                held[name][at] = column
        self._count = at + 1
        self._begun += self.num_envs

    def _grow(self, step: dict[str, np.ndarray]) -> None:
        """Twice the room (the first step sets the columns' shapes and dtypes)."""
        capacity = max(self.FIRST_CAPACITY, 2 * self._capacity)
        if not self._held:
            self._held = {
                name: np.empty((capacity, *np.shape(a)), np.asarray(a).dtype)
                for name, a in step.items()
            }
        else:
            self._held = {name: _resized(column, capacity) for name, column in self._held.items()}
        owed = np.ones((capacity, self.num_envs), dtype=bool)
        owed[: self._capacity] = self._owed
        self._owed, self._capacity = owed, capacity

    def _ended(self, start: int, stop: int) -> np.ndarray:
        """Where an episode ended, over held steps [start, stop)."""
        return self._held["terminated"][start:stop] | self._held["truncated"][start:stop]

    def fresh_steps(self) -> tuple[np.ndarray, np.ndarray]:
        """The rewards and episode ends ([steps, num_envs]) of the steps added since the
        last call, for `EpisodeTracker.steps`. Ask before each `take`: a take drops the
        steps it has given all the rows of."""
        start, self._fresh = self._fresh, self._count
        if not self._held:
            return np.zeros((0, self.num_envs)), np.zeros((0, self.num_envs), dtype=bool)
        return self._held["reward"][start : self._count].copy(), self._ended(start, self._count)

    def take(self, *, where: bool = False) -> dict[str, np.ndarray]:
        """All finished transitions as column arrays; the builder keeps the rest.

        `where`: also `ENV` (each row's env) and `LAST` (the row's step ended its
        episode), for grouping rows by episode (`EpisodeRows`)."""
        count = self._count
        if not count:
            return {name: np.zeros(0, np.float32) for name in self.COLUMNS}
        held = {name: column[:count] for name, column in self._held.items()}
        ended = self._ended(0, count)
        owed = self._owed[:count]
        # For each (step t, env): its n-step return, the step whose observation follows
        # (the episode's end or t + nstep - 1), whether it is terminal, its length.
        reward = held["reward"].astype(np.float64)
        ret = np.zeros(reward.shape)
        alive = np.ones(reward.shape, dtype=bool)  # no episode end in the window yet
        last = np.broadcast_to(np.arange(count)[:, None], reward.shape).copy()
        length = np.zeros(reward.shape, dtype=np.int64)
        done = np.zeros(reward.shape, dtype=bool)
        for k in range(self.nstep):
            span = count - k  # steps t with t + k held
            if span <= 0:
                break
            live = alive[:span]
            ret[:span] += np.where(live, self.gamma**k * reward[k:], 0.0)
            ends = live & ended[k:]
            last[:span][ends] += k
            length[:span][ends] = k + 1
            done[:span][ends] = held["terminated"][k:][ends]
            live &= ~ended[k:]
        whole = np.arange(count)[:, None] + self.nstep - 1 < count
        full = alive & whole
        last[full] += self.nstep - 1
        length[full] = self.nstep
        emit = owed & (~alive | whole)
        t, env = np.nonzero(emit)
        # Fancy indexing copies: the rows below own their data before the columns'
        # kept steps move to the front.
        extras = {
            # versions stay integers; the actor's columns are float32 data
            name: held[name][t, env] if name == VERSION else held[name][t, env].astype(np.float32)
            for name in held
            if name not in (*self.COLUMNS, *self.HELD)
        }
        action = held["action"][t, env]
        if where:
            extras |= {ENV: env, LAST: ended[t, env]}
        rows = extras | {
            "obs": as_obs(held["obs"][t, env]),
            # discrete: action ids; continuous: actions normalized to [-1, 1]
            "action": action.astype(np.float32 if action.dtype.kind == "f" else np.int64),
            "reward": ret[t, env].astype(np.float32),
            "next_obs": as_obs(held["next_obs"][last[t, env], env]),
            "done": done[t, env].astype(np.float32),
            "discount": (self.gamma ** length[t, env]).astype(np.float32),
        }
        # Steps older than the last nstep - 1 have given all their rows.
        keep = max(0, count - (self.nstep - 1))
        kept = count - keep
        remaining = owed[keep:] & ~emit[keep:]
        for column in self._held.values():
            column[:kept] = column[keep:count]
        self._owed[:kept] = remaining
        self._owed[kept:count] = True  # the rows the next steps land in
        self._count = kept
        self._fresh = max(0, self._fresh - keep)
        self._begun = int(remaining.sum())
        return rows


def _resized(array: np.ndarray, capacity: int) -> np.ndarray:
    """`array` with room for `capacity` entries along its first axis, its own kept."""
    grown = np.empty((capacity, *array.shape[1:]), array.dtype)
    grown[: len(array)] = array
    return grown


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


def ended_values(policy: SamplingActor, step: VectorStep) -> np.ndarray:
    """The critic's value of each final observation where an episode ended at `step`
    (a truncation bootstraps from it), 0 elsewhere: only those envs pass the critic,
    as the others' next value comes with their next action (`next_values`)."""
    out = np.zeros(len(step.ended), np.float32)
    if step.ended.any():
        out[step.ended] = policy.value(step.final_obs[step.ended])
    return out


def next_values(
    values: list[np.ndarray],
    ended: list[np.ndarray],
    at_ends: list[np.ndarray],
    after_last: np.ndarray,
) -> np.ndarray:
    """Each step's next-state value, [T, num_envs]: `at_ends` where the episode ended
    there (`ended_values`), else the value of the next step's observation, which is
    `values[t + 1]`, and `after_last` (the value of the observations after the round)
    for the last step."""
    following = np.concatenate([np.asarray(values[1:]), np.asarray(after_last)[None]])
    return np.where(np.asarray(ended), np.asarray(at_ends), following)


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
