"""The battle loop's pieces: GAE over each side's own moves, and opponents that cannot
act (a policy file gone or swapped) are skipped, never played."""

import numpy as np
import pytest

from common.messages import Match
from services.collector.battle import BattleLoop, Opponents, _gae_columns, _Round


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
