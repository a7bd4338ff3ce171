"""Self-play: a policy learns a two-player game against a league of opponents.

The `sync` workflow's rounds, played as games: each collect task runs the battle
loop (services/collector/battle.py), which asks the league for the opponent of
each game (`League.draw`: the policy itself, a past version or a fixed baseline),
plays the learning policy on the seat the match names, stores the learning side's
moves (both sides' in a game against itself, when `league.both_sides`) and reports
how each game ended (`League.report`). Every `league.snapshot_every` policy
versions the newest joins the pool. Evaluations are battles: the newest version
against each baseline of `league.eval_vs` for `env.n_evaluator_episode` games, half
on each seat; the job succeeds once the win rate against `league.stop.vs` reaches
`league.stop.win_rate` (or at `env.stop_value` on the games' mean outcome).

The league lives in the job's workflow state: recorded in the job's snapshots and
restored with them after a coordinator restart.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from common.config import ConfigError, JobConfig
from common.games import check_baseline, check_game_id
from common.messages import EvalResult, EvaluateSpec, GameTally, win_rate
from jobconfig import algorithm_of
from services.coordinator.league import League
from services.coordinator.workflows.base import Outcome, Planner
from services.coordinator.workflows.training import SyncTraining, TrainingState

if TYPE_CHECKING:
    from services.coordinator.state import Job, Task, TaskState

log = logging.getLogger(__name__)

#: Battle evaluations a job keeps (the newest); each is a few numbers.
MAX_BATTLES = 10_000


@dataclass(frozen=True)
class Battle:
    """One battle evaluation: the newest version's games against each baseline."""

    policy_version: int
    train_iter: int
    env_steps: int
    tallies: dict[str, GameTally]
    #: The learning policy's rating (openskill ordinal) when the result came in.
    rating: float | None = None

    def win_rate(self, baseline: str) -> float | None:
        """The score per game against `baseline` (`common.messages.win_rate`; None: not
        played)."""
        tally = self.tallies.get(baseline)
        return None if tally is None else win_rate(tally.wins, tally.draws, tally.losses)


@dataclass
class SelfPlayState(TrainingState):
    league: League | None = None
    battles: list[Battle] = field(default_factory=list)


def eval_opponents(config: JobConfig) -> list[str]:
    league = config.policy.other.league
    return list(league.baselines if league.eval_vs is None else league.eval_vs)


class SelfPlay(SyncTraining):
    collect_units = frozenset({"rounds"})
    has_league = True

    def check(self, config: JobConfig) -> None:
        super().check(config)
        if config.env.adapter != "pettingzoo":
            raise ConfigError(
                "env.adapter", "self-play plays two-player games: env.adapter must be pettingzoo"
            )
        columns = algorithm_of(config).columns
        if not any(column.kind == "mask" for column in columns):
            raise ConfigError(
                "policy.type",
                f"{config.policy.type} declares no action-mask column; self-play needs an "
                "algorithm that acts and learns with legal-action masks (ppo)",
            )
        # The game first: a baseline's rules are looked up by the game's name.
        env_id = check_game_id(config.env.env_id)
        league = config.policy.other.league
        section = "policy.other.league"
        for i, name in enumerate(league.baselines):
            check_baseline(name, env_id, f"{section}.baselines.{i}")
        for i, name in enumerate(league.eval_vs or []):
            check_baseline(name, env_id, f"{section}.eval_vs.{i}")
        if league.stop is not None:
            check_baseline(league.stop.vs, env_id, f"{section}.stop.vs")
        if league.stop is not None and league.stop.vs not in eval_opponents(config):
            raise ConfigError(
                "policy.other.league.stop.vs",
                f"'{league.stop.vs}' is not evaluated against: add it to league.eval_vs",
            )
        if sum(league.branch_probs.values()) <= 0:
            raise ConfigError("policy.other.league.branch_probs", "at least one must be > 0")
        if (
            league.branch_probs.get("pfsp", 0) > 0
            and not league.baselines
            and (league.branch_probs.get("sp", 0) <= 0)
        ):
            raise ConfigError(
                "policy.other.league.baselines",
                "the pool is empty until the first snapshot: name a baseline or give sp > 0",
            )

    def collect_mode(self, job: Job) -> Literal["transitions", "unrolls", "rounds", "battle"]:
        return "battle"

    def plan(self, job: Job, planner: Planner) -> list[Any]:
        state: SelfPlayState = job.workflow_state
        policy = job.policy
        if state.league is not None and policy is not None and policy.version > 0:
            member = state.league.add_snapshot(
                policy.version, policy.path, policy.sha256, job.env_steps
            )
            if member is not None:
                log.info("job %s: version %d joins the league", job.job_id, policy.version)
        return super().plan(job, planner)

    def evaluate_spec(self, job: Job, planner: Planner) -> EvaluateSpec:
        spec = super().evaluate_spec(job, planner)
        return dataclasses.replace(spec, opponents=eval_opponents(job.config))

    def evaluated(self, job: Job, task: Task, result: EvalResult, planner: Planner) -> None:
        super().evaluated(job, task, result, planner)
        if not result.tallies:
            return
        state: SelfPlayState = job.workflow_state
        state.battles.append(
            Battle(
                policy_version=result.policy_version,
                train_iter=job.evals[-1].train_iter,
                env_steps=job.env_steps,
                tallies=dict(result.tallies),
                rating=None if state.league is None else state.league.main_ordinal(),
            )
        )
        del state.battles[:-MAX_BATTLES]
        log.info(
            "job %s battle of version %d: %s",
            job.job_id,
            result.policy_version,
            ", ".join(
                f"{name} {rate:.2f}"
                for name in result.tallies
                if (rate := state.battles[-1].win_rate(name)) is not None
            ),
        )

    def task_ended(self, job: Job, task: Task, state: TaskState) -> None:
        super().task_ended(job, task, state)
        if task.kind == "collect" and job.workflow_state.league is not None:
            job.workflow_state.league.forget_task(task.task_id)

    def outcome(self, job: Job) -> Outcome | None:
        stop = job.config.policy.other.league.stop
        battles = job.workflow_state.battles
        if stop is not None and battles:
            rate = battles[-1].win_rate(stop.vs)
            if rate is not None and rate >= stop.win_rate:
                return Outcome(
                    "succeeded",
                    f"win rate {rate:.2f} against {stop.vs} >= {stop.win_rate} "
                    f"(policy version {battles[-1].policy_version})",
                )
        return super().outcome(job)

    def kept_versions(self, job: Job) -> set[int]:
        league = job.workflow_state.league
        if league is None:
            return set()
        return {m.version for m in league.members.values() if m.version is not None}

    def scalars(self, job: Job) -> dict[str, float]:
        """`league/rating` (main's ordinal), `league/rating_<baseline>`, and the newest
        battle's `league/win_rate_<baseline>`."""
        state: SelfPlayState = job.workflow_state
        if state.league is None:
            return {}
        view = state.league.view()
        scalars = {"league/rating": float(view["main"]["ordinal"])}
        for member in view["members"]:
            if member["kind"] == "baseline":
                scalars[f"league/rating_{member['name']}"] = float(member["ordinal"])
        if state.battles:
            for name in state.battles[-1].tallies:
                rate = state.battles[-1].win_rate(name)
                if rate is not None:
                    scalars[f"league/win_rate_{name}"] = rate
        return scalars

    def new_state(self, config: JobConfig) -> SelfPlayState:
        return SelfPlayState(league=League(config.policy.other.league, seed=config.system.seed))

    def record(self, state: SelfPlayState) -> dict[str, Any]:
        return {
            "eval_requested_iter": state.eval_requested_iter,
            "league": None if state.league is None else state.league.record(),
            "battles": [dataclasses.asdict(b) for b in state.battles],
        }

    def restore(self, record: dict[str, Any], config: JobConfig) -> SelfPlayState:
        league_record = record.get("league")
        league_config = config.policy.other.league
        league = (
            League(league_config, seed=config.system.seed)
            if league_record is None
            else League.restore(league_config, league_record, seed=config.system.seed)
        )
        battles = [
            Battle(
                policy_version=int(b["policy_version"]),
                train_iter=int(b["train_iter"]),
                env_steps=int(b["env_steps"]),
                tallies={name: GameTally(**t) for name, t in b["tallies"].items()},
                rating=b.get("rating"),
            )
            for b in record.get("battles", [])
        ]
        return SelfPlayState(
            eval_requested_iter=int(record.get("eval_requested_iter", 0)),
            league=league,
            battles=battles,
        )
