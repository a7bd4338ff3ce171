"""A self-play job's league: the opponents the learning policy ("main") plays, how each
game's opponent is chosen, and what the games showed.

The pool holds fixed baselines (`LeagueConfig.baselines`) and snapshots of past
policy versions (one every `snapshot_every` versions, at most `pool_size`, the oldest
retiring first). Each game of a collect task is a `Match`: main against itself
(`SELF`, with probability `branch_probs["sp"]`) or against a pool member drawn by
prioritized fictitious self-play (PFSP: more often those main does badly against).
Results come back from main's side; they fill a payoff table (main's wins, draws and
losses against each opponent) and move openskill ratings (Plackett-Luce).

Usage, by the `selfplay` workflow (under the coordinator's lock; nothing here does
I/O)::

    league = League(config.policy.other.league, seed=seed)
    league.add_snapshot(version, path, sha256, env_steps)   # each new policy version
    matches = league.draw(task_id, count)        # games for a collect task
    league.report(task_id, [(match_id, "win"), ...])   # what the task played
    league.report(task_id, [(match_id, "void")])  # drawn, not played: counts for nobody
    league.forget_task(task_id)                  # the task ended
    record = league.record()                     # JSON, in the job's snapshots
    league = League.restore(config.policy.other.league, record, seed=seed)

Everything it holds is bounded: the pool by `pool_size`, the payoff table by the pool
plus `MAX_RETIRED_TALLIES`, and the matches awaiting a report by
`MAX_OUTSTANDING_PER_TASK` for each task the coordinator has not yet forgotten.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np
from openskill.models import PlackettLuce

from common.config import ConfigError, LeagueConfig
from common.messages import win_rate

#: The opponent of a self-play game: main against itself.
SELF = "self"
#: Matches one draw may ask for.
MAX_MATCHES_PER_DRAW = 1024
#: Matches of one task drawn and not yet reported; a draw past it is refused (429), so
#: a collector that never reports cannot grow the league's record without bound.
MAX_OUTSTANDING_PER_TASK = 4096
#: Payoff tallies kept for opponents no longer in the pool (the oldest retired goes
#: first), so the table shows how main did against recent past versions without
#: growing with the job's length.
MAX_RETIRED_TALLIES = 64

GameResult = Literal["win", "draw", "loss"]
RESULTS: tuple[GameResult, ...] = ("win", "draw", "loss")
#: What a report says of a match drawn and never played (the collector could not load
#: its opponent): it is no longer outstanding, and counts for nobody.
VOID: Final = "void"
#: What a report may say of a match.
Reported = Literal["win", "draw", "loss", "void"]
#: The record's layout; `restore` reads this one.
RECORD_FORMAT = 1


class LeagueError(ValueError):
    """A report or request that does not fit the league: `field` is the offending field
    of the request (e.g. `results.3.match_id`), `status` the HTTP status to answer
    (400 malformed, 404 no such match, 409 not outstanding, 429 too many outstanding)."""

    def __init__(self, field: str, message: str, status: int = 400) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.status = status


@dataclass(kw_only=True)
class Member:
    """An opponent in the pool, with its openskill rating."""

    #: "random", "heuristic", or f"v{version}" for a snapshot.
    name: str
    kind: Literal["baseline", "snapshot"]
    #: Snapshots: the policy version, its file (relative to the shared root) and the
    #: file's digest, which a collector checks before playing it.
    version: int | None = None
    path: str | None = None
    sha256: str | None = None
    #: The job's env steps when it joined (baselines: 0).
    joined_env_steps: int = 0
    #: A snapshot joins with main's rating at that moment (it is that policy).
    mu: float
    sigma: float


@dataclass
class Tally:
    """Main's games against one opponent."""

    wins: int = 0
    draws: int = 0
    losses: int = 0

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    @property
    def win_rate(self) -> float:
        """Main's score per game, draws counting half (`common.messages.win_rate`);
        0.5 before any game."""
        rate = win_rate(self.wins, self.draws, self.losses)
        return 0.5 if rate is None else rate


@dataclass(frozen=True)
class Match:
    """One game assigned to a collect task."""

    match_id: int
    #: A member's name, or SELF.
    opponent: str
    #: The seat main plays, 0 or 1: it alternates from match to match, so main learns
    #: both sides of a game that is not symmetric.
    learner_seat: int
    #: The opponent's policy file (snapshots); None for baselines and SELF.
    version: int | None = None
    path: str | None = None
    sha256: str | None = None


class League:
    """The pool, the payoff table, the ratings and the matches awaiting a report."""

    def __init__(self, config: LeagueConfig, *, seed: int) -> None:
        pfsp = float(config.branch_probs.get("pfsp", 0.0))
        sp = float(config.branch_probs.get("sp", 0.0))
        if pfsp + sp <= 0:
            raise ConfigError("policy.other.league.branch_probs", "pfsp and sp must not both be 0")
        self.config = config
        #: The probability a game is main against itself.
        self.sp_prob = sp / (pfsp + sp)
        self._model = PlackettLuce()
        self.main_mu: float = self._model.mu
        self.main_sigma: float = self._model.sigma
        #: The pool by name: baselines first, then snapshots oldest first.
        self.members: dict[str, Member] = {
            name: Member(name=name, kind="baseline", mu=self._model.mu, sigma=self._model.sigma)
            for name in dict.fromkeys(config.baselines)
        }
        #: Main's games against each opponent: members, SELF and recently retired ones.
        self.payoff: dict[str, Tally] = {}
        #: Games reported in all.
        self.games = 0
        #: The version of the last snapshot that joined (None before the first).
        self.last_snapshot_version: int | None = None
        self._retired: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._outstanding: dict[str, dict[int, Match]] = {}
        self._task_of: dict[int, str] = {}
        self._next_match_id = 0
        self._rng = np.random.default_rng(seed)

    # -- the pool ------------------------------------------------------------------

    def add_snapshot(self, version: int, path: str, sha256: str, env_steps: int) -> Member | None:
        """Policy `version` joins the pool when it is the first snapshot or at least
        `snapshot_every` versions after the last one; past `pool_size` snapshots the
        oldest retires (its tally stays in the payoff table). Returns the new member,
        or None when the version does not join."""
        last = self.last_snapshot_version
        if last is not None and version < last + self.config.snapshot_every:
            return None
        name = f"v{version}"
        if name in self.members:
            return None
        member = Member(
            name=name,
            kind="snapshot",
            version=version,
            path=path,
            sha256=sha256,
            joined_env_steps=env_steps,
            mu=self.main_mu,
            sigma=self.main_sigma,
        )
        self.members[name] = member
        self.last_snapshot_version = version
        self._retired.pop(name, None)
        snapshots = [m.name for m in self.members.values() if m.kind == "snapshot"]
        for old in snapshots[: max(0, len(snapshots) - self.config.pool_size)]:
            del self.members[old]
            if old in self.payoff:
                self._mark_retired(old)
        return member

    def _mark_retired(self, name: str) -> None:
        self._retired[name] = None
        self._retired.move_to_end(name)
        while len(self._retired) > MAX_RETIRED_TALLIES:
            dropped, _ = self._retired.popitem(last=False)
            self.payoff.pop(dropped, None)

    # -- choosing opponents --------------------------------------------------------

    def win_rate(self, name: str) -> float:
        """Main's win rate against `name` as PFSP counts it: draws half, and 0.5 until
        `min_win_rate_games` games were played (a few lucky games decide nothing)."""
        tally = self.payoff.get(name)
        if tally is None or tally.games < max(1, self.config.min_win_rate_games):
            return 0.5
        return tally.win_rate

    def pfsp_weights(self) -> dict[str, float]:
        """Each member's probability of being drawn in a PFSP game (empty: no member).
        When every weight is 0 (main beats the whole pool under `squared`), the pool
        is drawn uniformly, so main is still checked against it."""
        weigh = {
            "squared": lambda p: (1 - p) ** 2,
            "variance": lambda p: p * (1 - p),
            "linear": lambda p: 1 - p,
        }[self.config.pfsp_weighting]
        raw = {name: weigh(self.win_rate(name)) for name in self.members}
        total = sum(raw.values())
        if total <= 0:
            return {name: 1 / len(raw) for name in raw}
        return {name: weight / total for name, weight in raw.items()}

    def draw(self, task_id: str, count: int) -> list[Match]:
        """`count` matches for collect task `task_id`, remembered until reported.

        Raises:
            LeagueError: `count` outside 1..MAX_MATCHES_PER_DRAW (400), or the task
                would have more than MAX_OUTSTANDING_PER_TASK matches unreported (429).
        """
        if isinstance(count, bool) or not isinstance(count, int):
            raise LeagueError("count", f"must be an integer, not {count!r}")
        if not 1 <= count <= MAX_MATCHES_PER_DRAW:
            raise LeagueError("count", f"{count} is not in 1..{MAX_MATCHES_PER_DRAW}")
        outstanding = self._outstanding.get(task_id, {})
        if len(outstanding) + count > MAX_OUTSTANDING_PER_TASK:
            raise LeagueError(
                "count",
                f"task {task_id} has {len(outstanding)} matches unreported; report them "
                f"before drawing more (at most {MAX_OUTSTANDING_PER_TASK})",
                429,
            )
        weights = self.pfsp_weights()
        names = list(weights)
        self_play = self._rng.random(count) < self.sp_prob
        picks = (
            self._rng.choice(len(names), size=count, p=list(weights.values()))
            if names
            else np.zeros(count, dtype=np.int64)
        )
        matches: list[Match] = []
        for plays_self, pick in zip(self_play, picks, strict=True):
            match_id = self._next_match_id
            self._next_match_id += 1
            seat = match_id % 2
            if plays_self or not names:  # an empty pool leaves only self-play
                matches.append(Match(match_id, SELF, seat))
                continue
            member = self.members[names[int(pick)]]
            matches.append(
                Match(match_id, member.name, seat, member.version, member.path, member.sha256)
            )
        self._remember(task_id, matches)
        return matches

    def _remember(self, task_id: str, matches: Iterable[Match]) -> None:
        outstanding = self._outstanding.setdefault(task_id, {})
        for match in matches:
            outstanding[match.match_id] = match
            self._task_of[match.match_id] = task_id

    def outstanding(self, task_id: str) -> list[Match]:
        """The task's matches drawn and not yet reported, oldest first."""
        return list(self._outstanding.get(task_id, {}).values())

    def forget_task(self, task_id: str) -> None:
        """A task that ended: its unreported matches are dropped (a late report of one
        is refused as not outstanding)."""
        for match_id in self._outstanding.pop(task_id, {}):
            self._task_of.pop(match_id, None)

    # -- results -------------------------------------------------------------------

    def report(self, task_id: str, results: list[tuple[int, Reported]]) -> None:
        """Results of the task's matches, each from main's side, or VOID for a match
        the task did not play (it is let go of and counts for nobody).

        The whole batch is checked before anything changes, so a refused report can be
        corrected and sent again whole. A game against an opponent that retired since
        the draw counts in the payoff table but rates nobody; a SELF game counts in the
        SELF tally and rates nobody (main against itself shows no skill).

        Raises:
            LeagueError: a malformed entry (400), a match id never drawn or drawn for
                another task (404), or one not outstanding: reported before, repeated
                in this batch, or dropped with its task or by a coordinator restart
                (409). Nothing changed.
        """
        seen: set[int] = set()
        for i, entry in enumerate(results):
            if not isinstance(entry, tuple | list) or len(entry) != 2:
                raise LeagueError(f"results.{i}", "must be a (match_id, result) pair")
            match_id, result = entry
            field = f"results.{i}.match_id"
            if isinstance(match_id, bool) or not isinstance(match_id, int):
                raise LeagueError(field, f"must be an integer, not {match_id!r}")
            if result not in RESULTS and result != VOID:
                raise LeagueError(
                    f"results.{i}.result",
                    f"{result!r} is not one of {', '.join(RESULTS)}, {VOID}",
                )
            if not 0 <= match_id < self._next_match_id:
                raise LeagueError(field, f"match {match_id} was never drawn", 404)
            if match_id in seen:
                raise LeagueError(field, f"match {match_id} is repeated in this report", 409)
            seen.add(match_id)
            owner = self._task_of.get(match_id)
            if owner is None:
                raise LeagueError(
                    field,
                    f"match {match_id} is not outstanding (already reported, or dropped when "
                    "its task ended or the coordinator restarted)",
                    409,
                )
            if owner != task_id:
                raise LeagueError(field, f"match {match_id} was drawn for another task", 404)
        outstanding = self._outstanding.get(task_id, {})
        for match_id, result in results:
            match = outstanding.pop(match_id)
            del self._task_of[match_id]
            if result != VOID:
                self._score(match.opponent, result)
        if task_id in self._outstanding and not outstanding:
            del self._outstanding[task_id]

    def _score(self, opponent: str, result: GameResult) -> None:
        tally = self.payoff.get(opponent)
        if tally is None:
            tally = self.payoff[opponent] = Tally()
            if opponent != SELF and opponent not in self.members:
                self._mark_retired(opponent)
        if result == "win":
            tally.wins += 1
        elif result == "draw":
            tally.draws += 1
        else:
            tally.losses += 1
        self.games += 1
        member = self.members.get(opponent)
        if member is None:  # SELF, or retired since the draw
            return
        ranks = {"win": [0, 1], "draw": [0, 0], "loss": [1, 0]}[result]
        main = self._model.rating(mu=self.main_mu, sigma=self.main_sigma)
        other = self._model.rating(mu=member.mu, sigma=member.sigma)
        [[main], [other]] = self._model.rate([[main], [other]], ranks=ranks)
        self.main_mu, self.main_sigma = main.mu, main.sigma
        member.mu, member.sigma = other.mu, other.sigma

    # -- views and records ---------------------------------------------------------

    def _ordinal(self, mu: float, sigma: float) -> float:
        return float(self._model.rating(mu=mu, sigma=sigma).ordinal())

    def main_ordinal(self) -> float:
        """The learning policy's rating as one number (mu - 3 sigma)."""
        return self._ordinal(self.main_mu, self.main_sigma)

    def view(self) -> dict[str, Any]:
        """What the job's status shows: main's rating, each member with its rating and
        main's results against it, and the whole payoff table (SELF and retired
        opponents included). `win_rate` is the plain one; PFSP's use of it is in
        `pfsp_weight`."""
        weights = self.pfsp_weights()
        members = []
        for member in self.members.values():
            tally = self.payoff.get(member.name, Tally())
            members.append(
                {
                    "name": member.name,
                    "kind": member.kind,
                    "version": member.version,
                    "joined_env_steps": member.joined_env_steps,
                    "mu": member.mu,
                    "sigma": member.sigma,
                    "ordinal": self._ordinal(member.mu, member.sigma),
                    "games": tally.games,
                    "wins": tally.wins,
                    "draws": tally.draws,
                    "losses": tally.losses,
                    "win_rate": tally.win_rate,
                    "pfsp_weight": weights[member.name],
                }
            )
        return {
            "main": {
                "mu": self.main_mu,
                "sigma": self.main_sigma,
                "ordinal": self._ordinal(self.main_mu, self.main_sigma),
            },
            "members": members,
            "payoff": {name: dataclasses.asdict(t) for name, t in self.payoff.items()},
            "games": self.games,
        }

    def record(self) -> dict[str, Any]:
        """The league as JSON data. Matches awaiting a report are left out: the tasks
        they were drawn for do not outlive the coordinator (`restore`)."""
        return {
            "format": RECORD_FORMAT,
            "main": {"mu": self.main_mu, "sigma": self.main_sigma},
            "members": [dataclasses.asdict(m) for m in self.members.values()],
            "payoff": {name: dataclasses.asdict(t) for name, t in self.payoff.items()},
            "retired": list(self._retired),
            "games": self.games,
            "last_snapshot_version": self.last_snapshot_version,
            "next_match_id": self._next_match_id,
        }

    @classmethod
    def restore(cls, config: LeagueConfig, record: dict[str, Any], *, seed: int) -> League:
        """The league `record` holds: its pool, ratings, payoff table and counters
        exactly. Draws go on from a generator seeded by `seed` plus the games played,
        so they do not repeat those before the restart.

        No match is outstanding: a restarted coordinator has none of the tasks they
        were drawn for, so nothing would ever report or forget them. Match ids go on
        from the record's; after a crash, ids drawn since the last snapshot may be drawn
        again, which is harmless: the tasks that drew them are gone, and their late
        reports are refused before the league sees them (the sender's task is not
        active, 409). (An older record's `outstanding` list is ignored.)

        Raises:
            ValueError: `record` is of a format this code does not read.
        """
        if record.get("format") != RECORD_FORMAT:
            raise ValueError(f"league record format {record.get('format')!r} is not supported")
        games = int(record["games"])
        league = cls(config, seed=seed + games)
        league.main_mu = float(record["main"]["mu"])
        league.main_sigma = float(record["main"]["sigma"])
        league.members = {m["name"]: Member(**m) for m in record["members"]}
        league.payoff = {name: Tally(**t) for name, t in record["payoff"].items()}
        league._retired = collections.OrderedDict.fromkeys(record["retired"])
        league.games = games
        last = record["last_snapshot_version"]
        league.last_snapshot_version = None if last is None else int(last)
        league._next_match_id = int(record["next_match_id"])
        return league
