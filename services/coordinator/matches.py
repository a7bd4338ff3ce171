"""A self-play job's league as the API reaches it: opponents drawn for a collect
task's games, the games' results, and what the league holds now.

The league itself is the `selfplay` workflow's state (services/coordinator/league.py);
this checks who asks (the worker running the named collect task of the job) and turns
the league's refusals into API errors naming the field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from common.errors import ApiError, not_found
from common.messages import GameResults, LeagueView, Match, MatchDraw, MatchList, parse
from services.coordinator.jobs import JobBook
from services.coordinator.league import League, LeagueError
from services.coordinator.snapshot import read_job_record
from services.coordinator.state import CoordinatorState, Job
from services.coordinator.tasks import TaskBoard
from services.coordinator.workflows import workflow_of
from services.coordinator.workflows.selfplay import SelfPlayState

_STATUS_CODES = {400: "invalid", 404: "not_found", 409: "conflict", 429: "too_many"}


def _api_error(exc: LeagueError) -> ApiError:
    return ApiError(exc.status, _STATUS_CODES.get(exc.status, "invalid"), str(exc))


class MatchDesk:
    def __init__(self, state: CoordinatorState, jobs: JobBook, tasks: TaskBoard) -> None:
        self.state = state
        self.jobs = jobs
        self.tasks = tasks

    @staticmethod
    def _league(job: Job) -> League:
        _check_has_league(job)
        state = job.workflow_state
        assert isinstance(state, SelfPlayState) and state.league is not None
        return state.league

    def draw(self, job_id: str, draw: MatchDraw, *, caller: str | None = None) -> MatchList:
        with self.state.guard.changing():
            job = self.jobs.running(job_id)
            league = self._league(job)
            self.tasks.check_sender(job_id, draw.task_id, "collect", caller)
            try:
                matches = league.draw(draw.task_id, draw.count)
            except LeagueError as exc:
                raise _api_error(exc) from None
        return MatchList(matches=[Match(**dataclasses.asdict(m)) for m in matches])

    def report(self, job_id: str, results: GameResults, *, caller: str | None = None) -> None:
        with self.state.guard.changing():
            job = self.jobs.running(job_id)
            league = self._league(job)
            self.tasks.check_sender(job_id, results.task_id, "collect", caller)
            try:
                league.report(results.task_id, [(r.match_id, r.outcome) for r in results.results])
            except LeagueError as exc:
                raise _api_error(exc) from None

    def view(self, job_id: str) -> LeagueView:
        return parse(LeagueView, self._view(job_id))

    def _view(self, job_id: str) -> dict[str, Any]:
        """The league's pool, ratings and payoff table; with the job's battle
        evaluations (`evaluations`: newest last, at most 100). An ended job's comes
        from its durable record."""
        with self.state.guard.changing():
            job = self.jobs.get(job_id)
            _check_has_league(job)
            if job.workflow_state is not None:
                return _state_view(job.workflow_state)
            config = job.config
        record = read_job_record(self.state.store, job_id) or {}
        workflow = record.get("workflow") or {}
        if workflow.get("league") is None:
            raise not_found(f"the league of job {job_id}")
        return _state_view(workflow_of(config).restore(workflow, config))


def _check_has_league(job: Job) -> None:
    """404 unless the job's workflow keeps a league (`Workflow.has_league`)."""
    if not workflow_of(job.config).has_league:
        raise not_found(
            f"a league of job {job.job_id} (its workflow, {job.config.system.workflow}, keeps none)"
        )


def _state_view(state: SelfPlayState) -> dict[str, Any]:
    assert state.league is not None
    view = state.league.view()
    view["evaluations"] = [_battle_view(b) for b in state.battles[-100:]]
    return view


def _battle_view(battle: Any) -> dict[str, Any]:
    return {
        "policy_version": battle.policy_version,
        "train_iter": battle.train_iter,
        "env_steps": battle.env_steps,
        "win_rates": {name: battle.win_rate(name) for name in battle.tallies},
        "rating": battle.rating,
        "tallies": {
            name: {"wins": t.wins, "draws": t.draws, "losses": t.losses}
            for name, t in battle.tallies.items()
        },
    }
