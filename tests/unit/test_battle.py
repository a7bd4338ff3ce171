"""The battle loop: GAE over each side's own moves; opponents that cannot act (a policy
file gone or swapped) are skipped, never played, and their matches reported void; past
versions in play stay loaded; and a round of many games reports its results as they
add up, within the league's bound on a task's outstanding matches."""

import dataclasses
import threading
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from common.messages import MAX_RESULTS_PER_REPORT, CollectSpec, Match
from services.collector.battle import (
    MAX_LOADED_OPPONENTS,
    MIN_DRAW,
    REPORT_AT_RESULTS,
    BattleLoop,
    Opponents,
    _gae_columns,
    _Round,
)


def one_round(values, masks=None):
    rows = len(values)
    return _Round(
        obs=[np.zeros((rows, 3), np.float32)],
        mask=[np.ones((rows, 2), np.float32) if masks is None else masks],
        action=[np.zeros(rows, np.int64)],
        logp=[np.zeros(rows, np.float32)],
        value=[np.asarray(values, np.float32)],
    )


def test_gae_follows_each_sides_own_moves():
    # Rows 0, 2, 3 are one side's moves (a chain ending in a win); row 1 is the other
    # side's only move, bootstrapped from 0.5 at the round's end.
    values = [0.1, 0.2, 0.3, 0.4]
    reward = [0.0, 0.0, 0.0, 1.0]
    done = [False, False, False, True]
    next_value = [0.3, 0.5, 0.4, 0.0]
    next_row = [2, -1, 3, -1]
    gamma, lam = 0.9, 0.8
    cols = _gae_columns(one_round(values), reward, done, next_value, next_row, gamma, lam)
    d3 = 1.0 - 0.4
    d2 = 0.0 + gamma * 0.4 - 0.3
    d0 = 0.0 + gamma * 0.3 - 0.1
    d1 = 0.0 + gamma * 0.5 - 0.2
    a3 = d3
    a2 = d2 + gamma * lam * a3
    a0 = d0 + gamma * lam * a2
    expected = np.array([a0, d1, a2, a3], np.float32)
    np.testing.assert_allclose(cols["adv"], expected, rtol=1e-6)
    np.testing.assert_allclose(cols["ret"], expected + np.asarray(values, np.float32), rtol=1e-6)
    assert set(cols) == {"obs", "action", "logp", "adv", "ret", "action_mask"}


class FakeCoordinator:
    def __init__(self, matches):
        self.matches = list(matches)

    def draw_matches(self, job_id, task_id, count):
        out, self.matches = self.matches[:count], self.matches[count:]
        return out


class FakeTask:
    job_id = "job-1"
    task_id = "collect-1"


class FakeCtx:
    def __init__(self, coordinator):
        self.coordinator = coordinator
        self.task = FakeTask()
        self.stop = threading.Event()
        self.progress = {}

    def stopped(self):
        return self.stop.is_set()


def test_a_match_whose_opponent_cannot_be_loaded_is_skipped(tmp_path):
    from common.storage import SharedStore
    from jobconfig import fit_to_env, resolve_job_config

    raw = {
        "env": {"adapter": "pettingzoo", "env_id": "pettingzoo.classic.tictactoe_v3"},
        "policy": {"type": "ppo"},
        "system": {"workflow": "selfplay"},
    }
    config = fit_to_env(resolve_job_config(raw)[0])
    missing = Match(
        match_id=0,
        opponent="v3",
        learner_seat=0,
        version=3,
        path="job-1/policies/00000003.safetensors",
        sha256="0" * 64,
    )
    fine = Match(match_id=1, opponent="heuristic", learner_seat=1)
    itself = Match(match_id=2, opponent="self", learner_seat=0)
    ctx = FakeCtx(FakeCoordinator([missing, fine, itself]))
    loop = BattleLoop(None, ctx, config, make_actor=lambda: None)
    opponents = Opponents(config, SharedStore(tmp_path), lambda: None, np.random.default_rng(0))
    assert loop._next_match(opponents) == fine
    assert loop._next_match(opponents) == itself
    ctx = FakeCtx(FakeCoordinator([missing] * 300))
    loop = BattleLoop(None, ctx, config, make_actor=lambda: None)
    with pytest.raises(RuntimeError, match="no opponent"):
        loop._next_match(opponents)


# -- a whole round through the loop, against a real league ---------------------------------


def tictactoe_config():
    from jobconfig import fit_to_env, resolve_job_config

    raw = {
        "env": {"adapter": "pettingzoo", "env_id": "pettingzoo.classic.tictactoe_v3"},
        "policy": {"type": "ppo"},
        "system": {"workflow": "selfplay"},
    }
    return fit_to_env(resolve_job_config(raw)[0])


class LeagueCoordinator:
    """The coordinator's league routes over a real League: its bound on outstanding
    matches (429) and its checks of each report, as the API answers them."""

    def __init__(self, league):
        self.league = league
        self.reports: list[int] = []
        self.outcomes: Counter[str] = Counter()

    def draw_matches(self, job_id, task_id, count):
        return [Match(**dataclasses.asdict(m)) for m in self.league.draw(task_id, count)]

    def report_games(self, job_id, task_id, results):
        assert 1 <= len(results) <= MAX_RESULTS_PER_REPORT  # GameResults' bound
        self.reports.append(len(results))
        self.outcomes.update(r.outcome for r in results)
        self.league.report(task_id, [(r.match_id, r.outcome) for r in results])


class RandomLegalPolicy:
    """A loaded policy version that moves at random among the legal moves."""

    loaded, version = True, 1

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def sample(self, obs, mask):
        action = np.array([self.rng.choice(np.flatnonzero(m)) for m in mask], np.int64)
        rows = len(obs)
        return action, np.zeros(rows, np.float32), np.zeros(rows, np.float32)

    def value(self, obs):
        return np.zeros(len(obs), np.float32)


class OneRoundRunner:
    """The collector runner's part the loop uses: one round is shipped, then the task
    is stopped."""

    def __init__(self, store, ctx):
        self.store = store
        self.ctx = ctx
        self.rows_shipped = 0

    def _sampling_rig(self, ctx, config, spec, make_envs, upload_wait_s):
        uploader = SimpleNamespace(raise_if_failed=lambda: None, close=lambda: None)
        uploader.segments_sent = 1
        follower = SimpleNamespace(wait_newer=lambda timeout_s: None)
        games = make_envs(config.env, spec.num_envs)
        return RandomLegalPolicy(spec.seed), follower, games, uploader, "worker.collect-1"

    def _ship(self, ctx, uploader, episodes, columns, worker_dir, seq, version, **counts):
        self.rows_shipped += len(columns["obs"])
        ctx.stop.set()
        return counts["env_steps"]


def play_one_round(tmp_path, league, round_steps):
    """One battle round of 64 tic-tac-toe games against `league`; the coordinator."""
    from common.storage import SharedStore

    coordinator = LeagueCoordinator(league)
    ctx = FakeCtx(coordinator)
    runner = OneRoundRunner(SharedStore(tmp_path), ctx)
    spec = CollectSpec(seed=0, num_envs=64, mode="battle", round_steps=round_steps)
    BattleLoop(runner, ctx, tictactoe_config(), make_actor=lambda: None).run(spec)
    assert runner.rows_shipped >= round_steps
    # What is left outstanding: the games in progress and the matches drawn ahead.
    assert len(league.outstanding(FakeTask.task_id)) <= spec.num_envs + MIN_DRAW
    return coordinator


def test_a_round_of_more_games_than_the_leagues_bound_reports_as_it_goes(tmp_path):
    from common.config import LeagueConfig
    from services.coordinator.league import MAX_OUTSTANDING_PER_TASK, League

    league = League(LeagueConfig(baselines=["random"]), seed=0)
    # A tic-tac-toe game is at most 9 moves, both sides' rows in a game against
    # itself, at most 5 in one against random: this many rows take more games than
    # the league lets a task hold unreported.
    coordinator = play_one_round(tmp_path, league, round_steps=6 * MAX_OUTSTANDING_PER_TASK)
    assert league.view()["games"] > MAX_OUTSTANDING_PER_TASK  # and no 429 on the way
    assert len(coordinator.reports) > 1
    assert max(coordinator.reports) <= REPORT_AT_RESULTS + MIN_DRAW


def test_matches_against_a_version_whose_file_is_gone_are_reported_void(tmp_path):
    from common.config import LeagueConfig
    from services.coordinator.league import League

    league = League(LeagueConfig(baselines=["random"], snapshot_every=1), seed=0)
    league.add_snapshot(1, "job-1/policies/00000001.safetensors", "0" * 64, env_steps=0)
    coordinator = play_one_round(tmp_path, league, round_steps=2000)
    # Each match against v1 was drawn, voided and let go of: none is outstanding
    # (checked in play_one_round), and none counts.
    assert coordinator.outcomes["void"] > 0
    payoff = league.view()["payoff"]
    assert "v1" not in payoff and payoff["random"]["wins"] + payoff["random"]["losses"] > 0
    assert league.view()["games"] == sum(
        t["wins"] + t["draws"] + t["losses"] for t in payoff.values()
    )


# -- past versions in play stay loaded ------------------------------------------------------


class CountingActor:
    """A past version's network: counts the policy files loaded, plays the first legal
    move."""

    def __init__(self, loads):
        self.loads = loads

    def load(self, version, tensors):
        self.loads.append(version)

    def sample(self, obs, mask):
        rows = len(obs)
        return mask.argmax(axis=1), np.zeros(rows, np.float32), np.zeros(rows, np.float32)


def versus(version, path, sha256):
    return Match(
        match_id=version,
        opponent=f"v{version}",
        learner_seat=0,
        version=version,
        path=path,
        sha256=sha256,
    )


def test_a_version_in_play_stays_loaded_past_the_cap_even_when_its_file_is_pruned(tmp_path):
    from common.storage import SharedStore

    store = SharedStore(tmp_path)
    config = tictactoe_config()
    count = MAX_LOADED_OPPONENTS + 4
    matches = []
    for version in range(count):
        path, sha256 = store.write_policy("job-1", version, 0, "ppo", {"w": np.zeros(2)})
        matches.append(versus(version, path, sha256))
    loads: list[int] = []
    opponents = Opponents(config, store, lambda: CountingActor(loads), np.random.default_rng(0))
    for match in matches:  # every game in progress: none is let go of
        opponents.ready(match)
    assert opponents.loaded() == list(range(count))
    for match in matches:  # the league retired them and their files were pruned
        (tmp_path / match.path).unlink()
    obs, mask = np.zeros((1, 27), np.float32), np.ones((1, 9), np.float32)
    for match in matches:
        assert opponents.act(match, obs, mask).tolist() == [0]
    assert loads == list(range(count))  # each file read once

    # Games end: past the cap, versions no game plays go, least recently readied first.
    for match in matches[:5]:
        opponents.finished(match)
    assert opponents.loaded() == list(range(4, count))  # v4 no longer played, at the cap
    path, sha256 = store.write_policy("job-1", count, 0, "ppo", {"w": np.zeros(2)})
    opponents.ready(versus(count, path, sha256))
    assert opponents.loaded() == [*range(5, count), count]  # v4 was the one not in play
    # A version let go of whose file is gone cannot be readied: the loop voids the match.
    with pytest.raises(FileNotFoundError):
        opponents.ready(matches[0])
    assert opponents.loaded() == [*range(5, count), count]


def test_a_finished_version_is_let_go_of_only_past_the_cap(tmp_path):
    from common.storage import SharedStore

    store = SharedStore(tmp_path)
    loads: list[int] = []
    opponents = Opponents(
        tictactoe_config(), store, lambda: CountingActor(loads), np.random.default_rng(0)
    )
    for version in range(MAX_LOADED_OPPONENTS + 1):
        path, sha256 = store.write_policy("job-1", version, 0, "ppo", {"w": np.zeros(2)})
        match = versus(version, path, sha256)
        opponents.ready(match)
        opponents.finished(match)
        opponents.ready(match)  # played again: still loaded, not read again
        opponents.finished(match)
    assert opponents.loaded() == list(range(1, MAX_LOADED_OPPONENTS + 1))
    assert loads == list(range(MAX_LOADED_OPPONENTS + 1))
