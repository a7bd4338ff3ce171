"""The self-play league: payoff counts and ratings from scripted games, PFSP's choice of
opponents, the snapshot pool's bounds, refused reports that change nothing, and a
record that survives JSON and a restart."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest

from common.config import ConfigError, LeagueConfig
from services.coordinator.league import (
    MAX_MATCHES_PER_DRAW,
    MAX_OUTSTANDING_PER_TASK,
    MAX_RETIRED_TALLIES,
    SELF,
    League,
    LeagueError,
)


def make_league(seed: int = 0, **overrides) -> League:
    settings = {"branch_probs": {"pfsp": 1.0, "sp": 0.0}, "min_win_rate_games": 4}
    settings.update(overrides)
    return League(LeagueConfig(**settings), seed=seed)


def opponent_only(league: League, opponent: str, results: list[str], task_id: str = "t") -> None:
    """Report `results` against `opponent`: draws one match at a time and drops
    (forget_task) those against anyone else. PFSP must still draw `opponent`: a test
    that wins every game against it keeps `min_win_rate_games` above its games."""
    for result in results:
        for _ in range(10_000):
            match = league.draw(task_id, 1)[0]
            if match.opponent == opponent:
                break
            league.forget_task(task_id)
        else:
            raise AssertionError(f"{opponent} was never drawn")
        league.report(task_id, [(match.match_id, result)])


def member_view(league: League, name: str) -> dict:
    return next(m for m in league.view()["members"] if m["name"] == name)


# -- scripted games --------------------------------------------------------------------


def test_payoff_counts_and_win_rates_are_exact():
    league = make_league()
    opponent_only(league, "random", ["win", "win", "draw", "loss", "win"])
    opponent_only(league, "heuristic", ["loss", "draw"])
    view = league.view()
    assert view["payoff"] == {
        "random": {"wins": 3, "draws": 1, "losses": 1},
        "heuristic": {"wins": 0, "draws": 1, "losses": 1},
    }
    assert view["games"] == 7
    random = member_view(league, "random")
    assert (random["games"], random["win_rate"]) == (5, pytest.approx(3.5 / 5))
    assert member_view(league, "heuristic")["win_rate"] == pytest.approx(0.25)
    assert league.win_rate("random") == pytest.approx(0.7)
    # Fewer games than min_win_rate_games (4): PFSP takes 0.5.
    assert league.win_rate("heuristic") == 0.5


def test_one_win_rate_counts_for_the_league_the_battles_and_drover_plot(tmp_path):
    from common.messages import GameTally, win_rate
    from drover.plot import battle_curve_of
    from services.coordinator.league import Tally
    from services.coordinator.workflows.selfplay import Battle

    assert win_rate(3, 2, 5) == pytest.approx(0.4)
    assert win_rate(0, 0, 0) is None
    assert Tally(wins=3, draws=2, losses=5).win_rate == pytest.approx(0.4)
    assert Tally().win_rate == 0.5  # PFSP's prior before any game
    tallies = {"heuristic": {"wins": 3, "draws": 2, "losses": 5}, "random": {}}
    battle = Battle(
        policy_version=4,
        train_iter=40,
        env_steps=4000,
        tallies={name: GameTally(**t) for name, t in tallies.items()},
    )
    assert battle.win_rate("heuristic") == pytest.approx(0.4)
    assert battle.win_rate("random") is None and battle.win_rate("minimax") is None
    record = {
        "job_id": "job-1",
        "config": {"env": {"env_id": "tictactoe"}, "policy": {"type": "ppo"}},
        "workflow": {"battles": [dataclasses.asdict(battle)]},
    }
    curve = battle_curve_of(record, tmp_path, "job", "env_steps", "win_rate", "heuristic")
    assert curve.y.tolist() == [pytest.approx(0.4)] and curve.x.tolist() == [4000]


def test_beating_an_opponent_moves_the_ratings_apart():
    league = make_league(min_win_rate_games=1000)  # PFSP keeps drawing random
    start = member_view(league, "random")["mu"]
    assert league.view()["main"]["mu"] == start
    opponent_only(league, "random", ["win"] * 10)
    view = league.view()
    assert view["main"]["mu"] > start + 1
    assert member_view(league, "random")["mu"] < start - 1
    assert member_view(league, "heuristic")["mu"] == start  # played no game
    assert view["main"]["sigma"] < member_view(league, "heuristic")["sigma"]


def test_a_draw_between_equal_ratings_barely_moves_mu():
    league = make_league()
    before = league.view()
    opponent_only(league, "heuristic", ["draw"])
    after = league.view()
    assert after["main"]["mu"] == pytest.approx(before["main"]["mu"], abs=1e-6)
    assert member_view(league, "heuristic")["mu"] == pytest.approx(25.0, abs=1e-6)
    assert after["main"]["sigma"] < before["main"]["sigma"]  # but it was evidence


def test_self_play_games_change_no_rating():
    league = make_league(branch_probs={"sp": 1.0})
    before = league.view()
    matches = league.draw("t", 6)
    results = ["win", "loss", "draw"] * 2
    league.report("t", [(m.match_id, r) for m, r in zip(matches, results, strict=True)])
    after = league.view()
    assert after["main"] == before["main"]
    assert after["members"] == before["members"]
    assert after["payoff"] == {SELF: {"wins": 2, "draws": 2, "losses": 2}}
    assert after["games"] == 6


def test_learner_seat_alternates_and_baselines_carry_no_file():
    league = make_league()
    matches = league.draw("t", 8)
    assert [m.learner_seat for m in matches] == [0, 1] * 4
    assert [m.match_id for m in matches] == list(range(8))
    assert all(m.path is None and m.version is None and m.sha256 is None for m in matches)


# -- PFSP --------------------------------------------------------------------------------


def test_pfsp_draws_the_opponent_main_loses_to_far_more_often():
    league = make_league(pfsp_weighting="squared", min_win_rate_games=4)
    opponent_only(league, "random", ["win"] * 4)
    opponent_only(league, "heuristic", ["loss"] * 4)
    weights = league.pfsp_weights()
    assert weights["heuristic"] > 0.99 and sum(weights.values()) == pytest.approx(1.0)
    drawn = Counter(m.opponent for m in league.draw("t", 1000))
    assert drawn["heuristic"] > 10 * max(1, drawn["random"])
    assert drawn[SELF] == 0


def test_pfsp_weights_are_equal_before_min_win_rate_games():
    league = make_league(min_win_rate_games=4)
    opponent_only(league, "random", ["win"] * 3)
    opponent_only(league, "heuristic", ["loss"] * 3)
    assert league.pfsp_weights() == {"random": 0.5, "heuristic": 0.5}


@pytest.mark.parametrize(
    ("weighting", "heuristic_share"),
    [("squared", 0.5625 / 0.625), ("variance", 0.5), ("linear", 0.75)],
)
def test_pfsp_weightings(weighting, heuristic_share):
    """Main scores p = 0.75 against random and 0.25 against heuristic: squared weighs
    them 0.0625 and 0.5625, variance 0.1875 each, linear 0.25 and 0.75."""
    league = make_league(pfsp_weighting=weighting, min_win_rate_games=4)
    opponent_only(league, "random", ["win", "win", "loss", "win"])
    opponent_only(league, "heuristic", ["loss", "win", "loss", "loss"])
    weights = league.pfsp_weights()
    assert weights["heuristic"] == pytest.approx(heuristic_share)
    assert weights["random"] == pytest.approx(1 - heuristic_share)


def test_main_beating_the_whole_pool_still_plays_it():
    league = make_league(min_win_rate_games=1)
    opponent_only(league, "random", ["win"])
    opponent_only(league, "heuristic", ["win"])
    assert league.pfsp_weights() == {"random": 0.5, "heuristic": 0.5}


def test_branch_probs_choose_between_self_play_and_the_pool():
    only_self = make_league(branch_probs={"pfsp": 0.0, "sp": 1.0})
    assert {m.opponent for m in only_self.draw("t", 500)} == {SELF}
    never_self = make_league(branch_probs={"pfsp": 1.0, "sp": 0.0})
    assert SELF not in {m.opponent for m in never_self.draw("t", 500)}
    half = make_league(branch_probs={"pfsp": 2.0, "sp": 2.0})
    share = sum(m.opponent == SELF for m in half.draw("t", 1000)) / 1000
    assert 0.4 < share < 0.6
    with pytest.raises(ConfigError):
        make_league(branch_probs={"pfsp": 0.0, "sp": 0.0})


def test_an_empty_pool_leaves_only_self_play():
    league = make_league(baselines=[])
    assert league.pfsp_weights() == {}
    assert {m.opponent for m in league.draw("t", 20)} == {SELF}


# -- the snapshot pool ---------------------------------------------------------------------


def add(league: League, version: int, env_steps: int = 0):
    return league.add_snapshot(
        version, f"job/policies/{version}.safetensors", f"{version:064x}", env_steps
    )


def snapshots(league: League) -> list[str]:
    return [m.name for m in league.members.values() if m.kind == "snapshot"]


def test_snapshots_join_every_snapshot_every_versions():
    league = make_league(snapshot_every=3)
    joined = [v for v in range(1, 12) if add(league, v, env_steps=v * 100) is not None]
    assert joined == [1, 4, 7, 10]
    assert league.last_snapshot_version == 10
    member = league.members["v4"]
    assert (member.kind, member.version, member.joined_env_steps) == ("snapshot", 4, 400)
    assert member.path == "job/policies/4.safetensors"


def test_a_snapshot_joins_with_mains_current_rating():
    league = make_league(min_win_rate_games=1000)
    opponent_only(league, "random", ["win"] * 5)
    member = add(league, 1)
    assert member is not None
    assert (member.mu, member.sigma) == (league.main_mu, league.main_sigma)


def test_the_pool_is_capped_and_the_oldest_snapshot_retires_first():
    league = make_league(snapshot_every=1, pool_size=3)
    for version in range(1, 7):
        add(league, version)
    assert snapshots(league) == ["v4", "v5", "v6"]
    assert list(league.members)[:2] == ["random", "heuristic"]  # baselines never retire
    drawn = {m.opponent for m in league.draw("t", 500)}
    assert drawn <= {"random", "heuristic", "v4", "v5", "v6"}


def test_snapshot_matches_carry_the_policy_file():
    league = make_league(baselines=[])
    add(league, 5)
    match = league.draw("t", 1)[0]
    assert (match.opponent, match.version) == ("v5", 5)
    assert (match.path, match.sha256) == ("job/policies/5.safetensors", f"{5:064x}")


def test_a_retired_opponents_outstanding_match_still_counts_in_the_payoff():
    league = make_league(snapshot_every=1, pool_size=1, baselines=[])
    add(league, 1)
    match = league.draw("t", 1)[0]
    assert match.opponent == "v1"
    add(league, 2)  # v1 retires
    assert snapshots(league) == ["v2"]
    before = league.view()
    league.report("t", [(match.match_id, "loss")])
    after = league.view()
    assert after["payoff"]["v1"] == {"wins": 0, "draws": 0, "losses": 1}
    assert after["main"] == before["main"]  # rates nobody
    assert after["members"] == before["members"]


def test_retired_tallies_are_bounded():
    league = make_league(snapshot_every=1, pool_size=1, baselines=[])
    for version in range(1, MAX_RETIRED_TALLIES + 12):
        add(league, version)
        opponent_only(league, f"v{version}", ["win"])
    payoff = league.view()["payoff"]
    assert len(payoff) == MAX_RETIRED_TALLIES + 1  # the retired ones and the member
    newest = MAX_RETIRED_TALLIES + 11
    assert f"v{newest}" in payoff and f"v{newest - MAX_RETIRED_TALLIES}" in payoff
    assert "v1" not in payoff
    assert league.view()["games"] == newest  # the total still counts every game


# -- refused requests ----------------------------------------------------------------------


def refused(league: League, task_id: str, results) -> LeagueError:
    before = (league.view(), league.record())
    with pytest.raises(LeagueError) as error:
        league.report(task_id, results)
    assert (league.view(), league.record()) == before  # nothing changed
    return error.value


def test_bad_reports_are_refused_and_change_nothing():
    league = make_league()
    mine = league.draw("a", 4)
    theirs = league.draw("b", 2)
    league.report("a", [(mine[0].match_id, "win")])

    error = refused(league, "a", [(999, "win")])
    assert (error.field, error.status) == ("results.0.match_id", 404)
    error = refused(league, "a", [(-1, "win")])
    assert (error.field, error.status) == ("results.0.match_id", 404)
    error = refused(league, "a", [(mine[1].match_id, "win"), (theirs[0].match_id, "win")])
    assert (error.field, error.status) == ("results.1.match_id", 404)
    error = refused(league, "a", [(mine[0].match_id, "win")])  # reported before
    assert (error.field, error.status) == ("results.0.match_id", 409)
    error = refused(league, "a", [(mine[1].match_id, "win"), (mine[1].match_id, "loss")])
    assert (error.field, error.status) == ("results.1.match_id", 409)
    # One bad entry after good ones: none of them counts.
    batch = [(mine[1].match_id, "win"), (mine[2].match_id, "loss"), (mine[3].match_id, "tie")]
    error = refused(league, "a", batch)
    assert (error.field, error.status) == ("results.2.result", 400)
    error = refused(league, "a", [(mine[1].match_id, "win"), ("3", "win")])
    assert (error.field, error.status) == ("results.1.match_id", 400)

    league.report("a", batch[:2])  # still outstanding, so accepted now
    assert league.view()["games"] == 3


@pytest.mark.parametrize("count", [0, -1, MAX_MATCHES_PER_DRAW + 1, 2000])
def test_draw_counts_outside_the_bounds_are_refused(count):
    league = make_league()
    with pytest.raises(LeagueError) as error:
        league.draw("t", count)
    assert (error.value.field, error.value.status) == ("count", 400)
    assert league.outstanding("t") == []


def test_outstanding_matches_per_task_are_bounded():
    league = make_league()
    for _ in range(MAX_OUTSTANDING_PER_TASK // MAX_MATCHES_PER_DRAW):
        league.draw("t", MAX_MATCHES_PER_DRAW)
    with pytest.raises(LeagueError) as error:
        league.draw("t", 1)
    assert (error.value.field, error.value.status) == ("count", 429)
    assert len(league.outstanding("t")) == MAX_OUTSTANDING_PER_TASK
    league.draw("other", 1)  # the bound is per task
    first = league.outstanding("t")[0]
    league.report("t", [(first.match_id, "draw")])
    assert len(league.draw("t", 1)) == 1  # a report makes room


def test_forget_task_drops_its_outstanding_matches():
    league = make_league()
    kept = league.draw("a", 3)
    dropped = league.draw("b", 3)
    league.forget_task("b")
    league.forget_task("never-drew")
    assert league.outstanding("b") == []
    assert league.outstanding("a") == kept
    with pytest.raises(LeagueError) as error:
        league.report("b", [(dropped[0].match_id, "win")])
    assert error.value.status == 409
    league.report("a", [(m.match_id, "win") for m in kept])
    assert league.view()["games"] == 3


def test_a_void_match_is_let_go_of_and_counts_for_nobody():
    # A collector that cannot load a match's opponent reports it void: it no longer
    # counts against the task's bound, and changes no tally or rating.
    league, only_the_win = make_league(baselines=["random"]), make_league(baselines=["random"])
    matches = league.draw("t", 3)
    assert only_the_win.draw("t", 3) == matches
    league.report("t", [(matches[0].match_id, "void"), (matches[1].match_id, "win")])
    only_the_win.report("t", [(matches[1].match_id, "win")])
    assert league.outstanding("t") == [matches[2]]
    assert league.view() == only_the_win.view()
    assert league.view()["payoff"] == {"random": {"wins": 1, "draws": 0, "losses": 0}}
    # Void is checked like the rest: once only, and only for the task's own matches.
    error = refused(league, "t", [(matches[0].match_id, "void")])
    assert (error.field, error.status) == ("results.0.match_id", 409)
    other = league.draw("u", 1)[0]
    error = refused(league, "t", [(matches[2].match_id, "void"), (other.match_id, "void")])
    assert (error.field, error.status) == ("results.1.match_id", 404)
    error = refused(league, "t", [(matches[2].match_id, "forfeit")])
    assert (error.field, error.status) == ("results.0.result", 400)
    assert "void" in str(error)


# -- record and restore ------------------------------------------------------------------


def test_record_survives_json_and_restore():
    config = LeagueConfig(
        snapshot_every=2, pool_size=2, min_win_rate_games=2, branch_probs={"pfsp": 3, "sp": 1}
    )
    league = League(config, seed=7)
    for version in (0, 2, 4, 6):
        add(league, version, env_steps=version * 1000)
        matches = league.draw("a", 24)
        results = ["win", "draw", "loss", "win"] * 6
        league.report("a", [(m.match_id, r) for m, r in zip(matches, results, strict=True)])
    league.draw("a", 5)  # outstanding: the record leaves them out
    pending_b = league.draw("b", 3)
    assert "v0" in league.view()["payoff"] and "v0" not in league.members  # retired, kept

    text = json.dumps(league.record())
    restored = League.restore(config, json.loads(text), seed=7)
    assert restored.view() == league.view()
    assert restored.record() == json.loads(text)
    assert restored.last_snapshot_version == 6
    # New matches continue the numbering (the outstanding ones are dropped: see the
    # next test), and snapshots the schedule.
    fresh = restored.draw("c", 4)
    assert fresh[0].match_id == pending_b[-1].match_id + 1
    restored.report("c", [(m.match_id, "win") for m in fresh])
    assert restored.view()["games"] == league.view()["games"] + 4
    assert add(restored, 7) is None and add(restored, 8) is not None


def test_restore_drops_the_outstanding_matches_and_never_reuses_their_ids():
    # A restarted coordinator has none of the tasks: their matches would stay
    # outstanding forever, so they are dropped, and a late report of one is refused
    # as after forget_task.
    league = make_league(snapshot_every=1)
    add(league, 1)
    pending = league.draw("a", 7) + league.draw("b", 3)
    league.report("a", [(pending[0].match_id, "win")])
    restored = League.restore(league.config, json.loads(json.dumps(league.record())), seed=0)
    assert restored.outstanding("a") == [] and restored.outstanding("b") == []
    fresh = restored.draw("a", 5)
    assert min(m.match_id for m in fresh) > max(m.match_id for m in pending)
    for late in (pending[0], pending[1], pending[-1]):  # reported before, or dropped
        task = "a" if late in pending[:7] else "b"
        error = refused(restored, task, [(late.match_id, "win")])
        assert (error.field, error.status) == ("results.0.match_id", 409)
    error = refused(restored, "a", [(fresh[-1].match_id + 1, "win")])
    assert (error.field, error.status) == ("results.0.match_id", 404)  # never drawn
    restored.report("a", [(m.match_id, "draw") for m in fresh])
    assert restored.view()["games"] == league.view()["games"] + 5


def test_a_record_with_outstanding_matches_from_before_still_restores_without_them():
    league = make_league()
    league.draw("a", 3)
    record = league.record()
    record["outstanding"] = {"a": [{"match_id": 0, "opponent": SELF, "learner_seat": 0}]}
    restored = League.restore(league.config, record, seed=0)
    assert restored.outstanding("a") == []
    assert restored.draw("a", 1)[0].match_id == 3


def test_restore_refuses_a_record_of_another_format():
    league = make_league()
    record = league.record()
    record["format"] = 99
    with pytest.raises(ValueError, match="format"):
        League.restore(league.config, record, seed=0)
