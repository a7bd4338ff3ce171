"""Two-player games for self-play: the battle collect loop and battle evaluation.

A battle collect task plays `num_envs` games at once (common/games.py: `GameVector`).
Each game is a match the league drew (`POST .../league/matches`): the learning
policy on the match's seat, the opponent on the other, which is the learning policy
itself (`self`), a past version (its policy file, checked by sha256) or a fixed
baseline. The learning side's moves are its rows (both sides' in a game against
itself when `league.both_sides`); its reward is what the game gave it between its
move and its next one. When a game ends its slot starts the next match at once.

How the games ended is reported (`POST .../league/results`) as they add up, before
more matches are drawn, and at each round's end: the league counts a match as
outstanding until its result comes, and refuses a task more than 4,096 of them
(its `MAX_OUTSTANDING_PER_TASK`), so a round of many games cannot wait for its end. A
match whose opponent cannot be loaded is reported `void`: not played, it counts for
nobody, and the league lets go of it.

Advantages are GAE over each side's own moves. A move whose side has not moved again
by the round's end is bootstrapped from the critic: the side's value of the position
when it is to move, and, when the other side is to move, minus that side's value
(the games are zero-sum and the network values a position for the side to move).

Illegal moves are never taken: every policy acts with the game's legal-action mask,
and the mask of each stored move is a column the learner trains with.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from algorithms.base import SamplingActor
from common.config import JobConfig
from common.games import GameVector, make_baseline
from common.messages import (
    MAX_RESULTS_PER_REPORT,
    CollectSpec,
    EvalResult,
    EvaluateSpec,
    GameResult,
    GameTally,
    Match,
)
from common.messages import dump as dump_message
from common.storage import SharedStore
from services.collector.step_data import EpisodeTracker

if TYPE_CHECKING:
    from services.collector.core import CollectorRunner
    from services.slave.core import TaskContext

log = logging.getLogger(__name__)

SELF = "self"
#: Past versions whose networks a task keeps loaded when no game plays them; one that
#: a game in progress plays stays loaded past it (the league's pool is small).
MAX_LOADED_OPPONENTS = 16
#: Matches drawn at a time, at least (one per game slot otherwise).
MIN_DRAW = 16
#: Drawn matches skipped in a row (their opponent could not be loaded) before the task
#: gives up: the league keeps handing out an opponent nobody can load.
MAX_SKIPPED_MATCHES = 256
#: Results a task holds back before it reports them, at its next draw: far below the
#: league's bound on a task's outstanding matches (4,096), which also counts the games
#: in progress and the matches drawn ahead.
REPORT_AT_RESULTS = 1024


def outcome_of(reward: float) -> Literal["win", "draw", "loss"]:
    return "win" if reward > 0 else "loss" if reward < 0 else "draw"


class Opponents:
    """What acts for the other seat: baselines, and past versions loaded from their
    policy files (checked against the digest the league named), kept by version.

    A game against a past version is played from `ready` to `finished`; the version
    stays loaded all that while, since its file may be gone by its next move (the
    league retires versions, and their files are pruned). Past the cap, the versions
    no game plays go first, least recently readied first::

        opponents.ready(match)         # the game starts (raises: skip the match)
        actions = opponents.act(match, obs, mask)   # each of the opponent's moves
        opponents.finished(match)      # the game ended
    """

    def __init__(
        self,
        config: JobConfig,
        store: SharedStore,
        make_actor: Callable[[], SamplingActor],
        rng: np.random.Generator,
    ) -> None:
        self.config = config
        self.store = store
        self.make_actor = make_actor
        self.rng = rng
        self._baselines: dict[str, Any] = {}
        self._versions: collections.OrderedDict[int, SamplingActor] = collections.OrderedDict()
        #: Games in progress against each loaded version.
        self._games_of: collections.Counter[int] = collections.Counter()

    def ready(self, match: Match) -> None:
        """Load what acts for `match`'s opponent, so a game never starts against one
        that cannot act.

        Raises:
            ValueError, OSError: a baseline this game lacks, or a past version whose
                policy file is missing, swapped (sha256), or not this algorithm's.
        """
        if match.opponent == SELF:
            return  # the learning policy itself
        if match.version is None:
            if match.opponent not in self._baselines:
                self._baselines[match.opponent] = make_baseline(
                    match.opponent, self.config.env.env_id
                )
            return
        if match.version not in self._versions:
            if match.path is None or match.sha256 is None:
                raise ValueError(f"match {match.match_id}: version {match.version} has no file")
            policy_file = self.store.read_policy(
                match.path, sha256=match.sha256, algo=self.config.policy.type
            )
            actor = self.make_actor()
            actor.load(match.version, policy_file.tensors)
            self._versions[match.version] = actor
        self._versions.move_to_end(match.version)
        self._games_of[match.version] += 1
        self._let_go()

    def finished(self, match: Match) -> None:
        """`match`'s game ended: its version may be let go of."""
        if match.version is None:
            return
        self._games_of[match.version] -= 1
        if self._games_of[match.version] <= 0:
            del self._games_of[match.version]
        self._let_go()

    def _let_go(self) -> None:
        """Past the cap, unload the versions no game plays, least recently readied first
        (all played: over the cap until games end, rather than reading files again)."""
        idle = [version for version in self._versions if version not in self._games_of]
        for version in idle[: max(0, len(self._versions) - MAX_LOADED_OPPONENTS)]:
            del self._versions[version]

    def loaded(self) -> list[int]:
        """The past versions loaded, least recently readied first."""
        return list(self._versions)

    def act(self, match: Match, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The opponent's moves in the games of `match`'s opponent (`ready` first)."""
        if match.version is None:
            baseline = self._baselines[match.opponent]
            return np.asarray(baseline.act(obs, mask, self.rng), dtype=np.int64)
        actor = self._versions[match.version]  # loaded while its game is in progress
        action, _, _ = actor.sample(obs, mask)  # type: ignore[call-arg]  # a masked actor
        return np.asarray(action, dtype=np.int64)


@dataclass
class _Round:
    """One round's moves of the learning side, with what GAE needs of each."""

    obs: list[np.ndarray]
    mask: list[np.ndarray]
    action: list[np.ndarray]
    logp: list[np.ndarray]
    value: list[np.ndarray]

    @classmethod
    def empty(cls) -> _Round:
        return cls([], [], [], [], [])


class BattleLoop:
    """The battle collect loop of one task (see the module's docstring)."""

    def __init__(
        self,
        runner: CollectorRunner,
        ctx: TaskContext,
        config: JobConfig,
        make_actor: Callable[[], SamplingActor],
    ) -> None:
        self.runner = runner
        self.make_actor = make_actor
        self.ctx = ctx
        self.config = config
        self.league = config.policy.other.league
        self.job_id = ctx.task.job_id
        self._queue: collections.deque[Match] = collections.deque()
        self._results: list[GameResult] = []

    def _draw(self, count: int) -> None:
        matches = self.ctx.coordinator.draw_matches(
            self.job_id, self.ctx.task.task_id, max(count, MIN_DRAW)
        )
        self._queue.extend(matches)

    def _next_match(self, opponents: Opponents) -> Match:
        """The next drawn match whose opponent can act. One that cannot (its policy
        file gone or swapped) is skipped and reported void: it counts for nobody."""
        for _ in range(MAX_SKIPPED_MATCHES):
            if not self._queue:
                # What was played is reported before more is drawn, so the task's
                # outstanding matches stay under the league's bound.
                if len(self._results) >= REPORT_AT_RESULTS:
                    self._report()
                self._draw(1)
            match = self._queue.popleft()
            try:
                opponents.ready(match)
                return match
            except (OSError, ValueError) as exc:
                log.warning("skipping match %d against %s: %s", match.match_id, match.opponent, exc)
                self._results.append(GameResult(match_id=match.match_id, outcome="void"))
        raise RuntimeError(f"{MAX_SKIPPED_MATCHES} drawn matches in a row had no opponent to play")

    def _game_over(self, match: Match, reward: float, opponents: Opponents) -> Match:
        """`match`'s game ended with `reward` for the learning side: its result waits
        to be reported, and the slot's next match is returned."""
        self._results.append(GameResult(match_id=match.match_id, outcome=outcome_of(reward)))
        opponents.finished(match)
        return self._next_match(opponents)

    def _report(self) -> None:
        """Report the results held back, at most MAX_RESULTS_PER_REPORT a request."""
        while self._results:
            results = self._results[:MAX_RESULTS_PER_REPORT]
            del self._results[:MAX_RESULTS_PER_REPORT]
            self.ctx.coordinator.report_games(self.job_id, self.ctx.task.task_id, results)

    def run(self, spec: CollectSpec) -> dict[str, Any]:
        runner, ctx, config = self.runner, self.ctx, self.config
        gamma = config.policy.discount_factor
        lam = config.policy.collect.gae_lambda  # type: ignore[attr-defined]
        from services.collector.core import wait_for_newer  # core imports this module

        policy, follower, games, uploader, worker_dir = runner._sampling_rig(
            ctx, config, spec, lambda env, n: GameVector(env, n), upload_wait_s=0.0
        )
        rng = np.random.default_rng(spec.seed)
        opponents = Opponents(config, runner.store, self.make_actor, rng)
        n = spec.num_envs
        round_steps = spec.round_steps or config.policy.collect.n_sample
        games.reset(seed=spec.seed)
        self._draw(n)
        matches = [self._next_match(opponents) for _ in range(n)]
        episodes = EpisodeTracker(n)
        last_version, env_steps, seq = 0, 0, 0
        started = time.monotonic()
        slots = np.arange(n)
        try:
            while wait_for_newer(ctx, policy, follower, uploader, last_version):
                version = policy.version
                moves = _Round.empty()
                # Per row: reward, whether the game ended at it, the value after it,
                # and the same side's next row (-1: none yet).
                reward: list[float] = []
                done: list[bool] = []
                next_value: list[float] = []
                next_row: list[int] = []
                pending = np.full((n, 2), -1, dtype=np.int64)
                steps = 0
                while len(reward) < round_steps and not ctx.stopped():
                    seat = np.array([m.learner_seat for m in matches])
                    is_self = np.array([m.opponent == SELF for m in matches])
                    to_move = games.to_move
                    ours = (to_move == seat) | is_self
                    recorded = (to_move == seat) | (is_self & self.league.both_sides)
                    actions = np.zeros(n, dtype=np.int64)
                    mine = np.flatnonzero(ours)
                    if mine.size:
                        obs, mask = games.obs[mine], games.mask[mine]
                        action, logp, value = policy.sample(obs, mask)  # type: ignore[call-arg]
                        actions[mine] = action
                        keep = recorded[mine]
                        rows = mine[keep]
                        if rows.size:
                            first = len(reward)
                            kept_values = value[keep]
                            for k, i in enumerate(rows):
                                s = int(to_move[i])
                                row = first + k
                                before = int(pending[i, s])
                                if before >= 0:  # the side's previous move: its next state
                                    next_value[before] = float(kept_values[k])
                                    next_row[before] = row
                                pending[i, s] = row
                            reward.extend([0.0] * rows.size)
                            done.extend([False] * rows.size)
                            next_value.extend([0.0] * rows.size)
                            next_row.extend([-1] * rows.size)
                            moves.obs.append(obs[keep])
                            moves.mask.append(mask[keep])
                            moves.action.append(action[keep])
                            moves.logp.append(logp[keep])
                            moves.value.append(value[keep])
                    # The other seats, one batch per opponent.
                    by_opponent: dict[tuple[str, int | None], list[int]] = collections.defaultdict(
                        list
                    )
                    for i in np.flatnonzero(~ours):
                        by_opponent[(matches[i].opponent, matches[i].version)].append(int(i))
                    for group in by_opponent.values():
                        idx = np.asarray(group)
                        actions[idx] = opponents.act(
                            matches[group[0]], games.obs[idx], games.mask[idx]
                        )
                    step = games.step(actions)
                    steps += 1
                    has = pending >= 0
                    for i, s in zip(*np.nonzero(has), strict=True):
                        reward[pending[i, s]] += float(step.rewards[i, s])
                    learner_rewards = step.rewards[slots, seat]
                    episodes.step(learner_rewards, step.ended)
                    for i in np.flatnonzero(step.ended):
                        for s in (0, 1):
                            row = int(pending[i, s])
                            if row >= 0:
                                done[row] = True
                            pending[i, s] = -1
                        matches[i] = self._game_over(
                            matches[i], float(learner_rewards[i]), opponents
                        )
                if ctx.stopped():
                    break
                # The moves whose side has not moved again: bootstrapped (see above).
                waiting = np.argwhere(pending >= 0)
                if len(waiting):
                    values = policy.value(games.obs[waiting[:, 0]])
                    for (i, s), v in zip(waiting, values, strict=True):
                        sign = 1.0 if games.to_move[i] == s else -1.0
                        next_value[pending[i, s]] = sign * float(v)
                columns = _gae_columns(moves, reward, done, next_value, next_row, gamma, lam)
                env_steps += runner._ship(
                    ctx,
                    uploader,
                    episodes,
                    columns,
                    worker_dir,
                    seq,
                    version,
                    env_steps=steps * n,
                    total_env_steps=env_steps,
                    started=started,
                )
                self._report()
                seq += 1
                last_version = version
        finally:
            try:
                self._report()
            except Exception as exc:  # the task is ending: its games are lost, not it
                log.warning("task %s: game results not reported: %s", ctx.task.task_id, exc)
            uploader.close()
            games.close()
        return {"env_steps": env_steps, "segments": uploader.segments_sent}


def _gae_columns(
    moves: _Round,
    reward: list[float],
    done: list[bool],
    next_value: list[float],
    next_row: list[int],
    gamma: float,
    lam: float,
) -> dict[str, np.ndarray]:
    """The round's columns, with GAE advantages and returns over each side's chain of
    moves (`next_row`), newest first."""
    value = np.concatenate(moves.value).astype(np.float32)
    rows = len(value)
    adv = np.zeros(rows, dtype=np.float32)
    for row in range(rows - 1, -1, -1):
        live = 0.0 if done[row] else 1.0
        delta = reward[row] + gamma * next_value[row] * live - value[row]
        after = next_row[row]
        carry = adv[after] if after >= 0 and live else 0.0
        adv[row] = delta + gamma * lam * live * carry
    return {
        "obs": np.concatenate(moves.obs).astype(np.float32),
        "action": np.concatenate(moves.action).astype(np.int64),
        "logp": np.concatenate(moves.logp).astype(np.float32),
        "adv": adv,
        "ret": adv + value,
        "action_mask": np.concatenate(moves.mask).astype(np.float32),
    }


def battle_evaluation(
    ctx: TaskContext, config: JobConfig, spec: EvaluateSpec, policy: Any
) -> dict[str, Any]:
    """`spec.episodes` games of the loaded `policy` (its most likely legal move)
    against each of `spec.opponents`, the policy on seat 0 in every other game."""
    rng = np.random.default_rng(spec.seed)
    returns: list[float] = []
    lengths: list[int] = []
    tallies: dict[str, GameTally] = {}
    for name in spec.opponents:
        baseline = make_baseline(name, config.env.env_id)
        num_games = min(spec.num_envs, spec.episodes)
        games = GameVector(config.env, num_games)
        try:
            games.reset(seed=spec.seed)
            started = np.arange(num_games)  # game k of this opponent in slot k
            seat = started % 2
            moves = np.zeros(num_games, dtype=np.int64)
            wins = draws = losses = 0
            played = 0
            next_game = num_games
            active = np.ones(num_games, dtype=bool)
            while active.any() and not ctx.stopped():
                ours = games.to_move == seat
                actions = np.zeros(num_games, dtype=np.int64)
                mine = np.flatnonzero(ours)
                if mine.size:
                    actions[mine] = policy.greedy(games.obs[mine], rng, games.mask[mine])
                theirs = np.flatnonzero(~ours)
                if theirs.size:
                    actions[theirs] = baseline.act(games.obs[theirs], games.mask[theirs], rng)
                step = games.step(actions)
                moves += 1
                for i in np.flatnonzero(step.ended):
                    if not active[i]:
                        continue
                    result = float(step.rewards[i, seat[i]])
                    wins, draws, losses = (
                        wins + (result > 0),
                        draws + (result == 0),
                        losses + (result < 0),
                    )
                    returns.append(result)
                    lengths.append(int(moves[i]))
                    played += 1
                    moves[i] = 0
                    if next_game < spec.episodes:
                        seat[i] = next_game % 2
                        next_game += 1
                    else:
                        active[i] = False
                ctx.progress["episodes"] = len(returns)
        finally:
            games.close()
        tallies[name] = GameTally(wins=wins, draws=draws, losses=losses)
    return dump_message(
        EvalResult(
            policy_version=spec.policy_version, returns=returns, lengths=lengths, tallies=tallies
        )
    )
