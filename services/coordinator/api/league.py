"""A self-play job's league: its pool, ratings and payoff table for users; opponents
drawn for a collector's games and the games' results."""

from typing import Any

from flask import Blueprint, Response

from common.http import allow, body, caller, reply
from common.messages import GameResults, LeagueView, MatchDraw, MatchList
from common.openapi import documented
from services.coordinator.api import core

bp = Blueprint("league", __name__, url_prefix="/api/v1/jobs/<job_id>/league")


@bp.get("")
@documented(summary="A self-play job's league: pool, ratings, payoff table", reply=LeagueView)
def view(job_id: str) -> Any:
    return reply(core().league(job_id))


@bp.post("/matches")
@allow("collector")
@documented(summary="Opponents for a collect task's next games", body=MatchDraw, reply=MatchList)
def draw(job_id: str) -> Any:
    return reply(core().draw_matches(job_id, body(MatchDraw), caller=caller()))


@bp.post("/results")
@allow("collector")
@documented(
    summary="How a collect task's games ended (all or none are taken)",
    body=GameResults,
    no_content="taken",
)
def results(job_id: str) -> Any:
    core().report_games(job_id, body(GameResults), caller=caller())
    return Response(status=204)
