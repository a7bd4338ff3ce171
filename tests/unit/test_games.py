"""Two-player games (common/games.py): a request names only allowed game modules, many
games step together as PettingZoo plays them, and the baselines play as their rules
say (the heuristic wins and blocks, minimax never loses at tic-tac-toe)."""

import sys
import uuid

import numpy as np
import pytest

from common.config import ConfigError, EnvConfig
from common.env_guard import ENV_MODULES_VAR
from common.envs import env_spaces, make_env
from common.games import (
    CONNECT_FOUR,
    GAME_MODULES,
    GAME_RULES,
    TICTACTOE,
    Baseline,
    GameVector,
    check_baseline,
    check_game_id,
    make_baseline,
)

# PettingZoo's version modules warn on import (common/games.py filters it for services;
# pytest's own filters come first in a test).
pytestmark = pytest.mark.filterwarnings("ignore:The old environment creation API")


def game_config(env_id: str, **kwargs) -> EnvConfig:
    return EnvConfig(env_id=env_id, adapter="pettingzoo", **kwargs)


@pytest.fixture
def plant(tmp_path, monkeypatch):
    """Writes a module of this source under a fresh name on sys.path; returns its name
    and the file it writes when it runs."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def planted(source: str = "") -> tuple[str, object]:
        name = f"planted_{uuid.uuid4().hex}"
        marker = tmp_path / f"{name}.ran"
        (tmp_path / f"{name}.py").write_text(
            f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n{source}"
        )
        return name, marker

    yield planted
    for name in [m for m in sys.modules if m.startswith("planted_")]:
        del sys.modules[name]


def play(env_id: str, players: tuple[Baseline, Baseline], num_games: int, seed: int) -> np.ndarray:
    """[num_games]: seat 0's outcome of each game's first game (+1 won, 0 drew, -1 lost),
    `players[s]` on seat s."""
    games = GameVector(game_config(env_id), num_games)
    games.reset(seed)
    rng = np.random.default_rng(seed)
    result = np.full(num_games, np.nan)
    try:
        while np.isnan(result).any():
            actions = np.empty(num_games, np.int64)
            for seat, player in enumerate(players):
                rows = games.to_move == seat
                if rows.any():
                    actions[rows] = player.act(games.obs[rows], games.mask[rows], rng)
            step = games.step(actions)
            first = step.ended & np.isnan(result)
            result[first] = step.rewards[first, 0]
    finally:
        games.close()
    return result


def scripted(env_id: str, moves: list[int]) -> GameVector:
    """One game with these moves played, seats taking turns from seat 0."""
    games = GameVector(game_config(env_id), 1)
    games.reset(0)
    for move in moves:
        assert not games.step(np.array([move])).ended[0]
    return games


# --- what a request may name ---------------------------------------------------------


@pytest.mark.parametrize("env_id", ["os", "a/b", "../games", "pettingzoo.classic.chess_v6", ""])
def test_a_game_id_not_allowed_is_refused_before_anything_is_imported(env_id):
    before = set(sys.modules)
    with pytest.raises(ConfigError) as err:
        check_game_id(env_id)
    assert err.value.field == "env.env_id"
    assert set(sys.modules) == before
    if _looks_like_module(env_id):
        assert CONNECT_FOUR in err.value.message and ENV_MODULES_VAR in err.value.message


def _looks_like_module(env_id: str) -> bool:
    return bool(env_id) and all(part.isidentifier() for part in env_id.split("."))


def test_a_planted_module_is_not_run_through_any_entry(plant):
    name, marker = plant("def env():\n    raise SystemExit('must not run')\n")
    config = game_config(name)
    for attempt in (
        lambda: check_game_id(name),
        lambda: env_spaces(config),
        lambda: GameVector(config, 2),
        lambda: make_env(config, 2),
    ):
        with pytest.raises(ConfigError) as err:
            attempt()
        assert err.value.field in ("env.env_id", "env.adapter")
    assert not marker.exists() and name not in sys.modules


def test_a_module_the_operator_lists_is_allowed_and_played(plant, monkeypatch):
    name, marker = plant("from pettingzoo.classic.connect_four_v3 import env\n")
    monkeypatch.setenv(ENV_MODULES_VAR, f"minigrid, {name}")
    assert check_game_id(name) == name
    assert not marker.exists()  # allowing it imports nothing either
    assert env_spaces(game_config(name)).obs_shape == (84,)
    assert marker.exists()
    games = GameVector(game_config(name), 3)
    games.reset(seed=1)
    assert games.mask.shape == (3, 7)
    games.close()


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("", "no env()"),
        ("env = 3\n", "no env()"),
        ("raise ImportError('needs chess')\n", "cannot be loaded"),
        ("import chess_engine_not_installed\n", "not installed: chess_engine_not_installed"),
        ("from pettingzoo.classic.rps_v2 import env\n", "observes"),
        ("def env():\n    return object()\n", "not a PettingZoo AEC env"),
    ],
)
def test_a_listed_module_that_is_not_a_fitting_game_is_refused(plant, monkeypatch, source, problem):
    name, _ = plant(source)
    monkeypatch.setenv(ENV_MODULES_VAR, name)
    with pytest.raises(ConfigError) as err:
        env_spaces(game_config(name))
    assert err.value.field == "env.env_id" and problem in err.value.message


def test_a_listed_module_that_does_not_exist_is_refused(monkeypatch):
    monkeypatch.setenv(ENV_MODULES_VAR, "pettingzoo.classic.no_such_game_v1")
    with pytest.raises(ConfigError) as err:
        env_spaces(game_config("pettingzoo.classic.no_such_game_v1"))
    assert err.value.field == "env.env_id" and "no module" in err.value.message


def test_a_game_takes_no_kwargs_obs_key_or_frame_stack():
    for kwargs, field in (
        ({"env_kwargs": {"render_mode": "human"}}, "env.env_kwargs"),
        ({"obs_key": "observation"}, "env.obs_key"),
        ({"frame_stack": 4}, "env.frame_stack"),
    ):
        with pytest.raises(ConfigError) as err:
            env_spaces(game_config(CONNECT_FOUR, **kwargs))
        assert err.value.field == field


# --- spaces and the adapter ------------------------------------------------------------


@pytest.mark.parametrize(
    ("env_id", "obs_size", "num_actions"), [(TICTACTOE, 18, 9), (CONNECT_FOUR, 84, 7)]
)
def test_the_adapter_reports_the_spaces_and_makes_no_vector_env(env_id, obs_size, num_actions):
    spaces = env_spaces(game_config(env_id))
    assert spaces.obs_shape == (obs_size,) and spaces.action_shape == num_actions
    assert spaces.action_space == "discrete" and spaces.obs_dtype == "float32"
    assert spaces.action_mask is True and spaces.players == 2
    with pytest.raises(ConfigError) as err:
        make_env(game_config(env_id), 4)
    assert err.value.field == "env.adapter" and "selfplay" in err.value.message


def test_single_agent_envs_keep_the_defaults():
    spaces = env_spaces(EnvConfig(env_id="CartPole-v1"))
    assert spaces.action_mask is False and spaces.players == 1


# --- many games stepped together ------------------------------------------------------


@pytest.mark.parametrize("env_id", GAME_MODULES)
def test_random_legal_moves_play_whole_games_that_reset_at_once(env_id):
    num_games, steps = 20, 500  # 10,000 moves
    games = GameVector(game_config(env_id), num_games)
    games.reset(seed=3)
    rng = np.random.default_rng(3)
    random = make_baseline("random", env_id)
    outcomes = {"win": 0, "draw": 0}
    for _ in range(steps):
        assert (games.mask.max(axis=1) == 1).all() and set(np.unique(games.mask)) <= {0, 1}
        obs_before, to_move_before = games.obs, games.to_move
        kept = obs_before.copy()
        step = games.step(random.act(games.obs, games.mask, rng))
        assert step.rewards.shape == (num_games, 2) and step.rewards.dtype == np.float32
        assert np.array_equal(obs_before, kept)  # new arrays each step, never in place
        going = ~step.ended
        assert (step.rewards[going] == 0).all()
        assert (games.to_move[going] == 1 - to_move_before[going]).all()
        for r0, r1 in step.rewards[step.ended]:
            assert (r0, r1) in ((1, -1), (-1, 1), (0, 0))
            outcomes["draw" if r0 == 0 else "win"] += 1
        # An ended game shows its next game's first position: an empty board, seat 0.
        assert (games.obs[step.ended] == 0).all() and (games.to_move[step.ended] == 0).all()
    assert outcomes["win"] > 100
    if env_id == TICTACTOE:
        assert outcomes["draw"] > 10
    games.close()


@pytest.mark.parametrize("env_id", GAME_MODULES)
def test_an_illegal_action_raises_naming_the_game_and_steps_nothing(env_id):
    games = scripted(env_id, [0, 0, 0, 0, 0, 0] if env_id == CONNECT_FOUR else [0])
    other = GameVector(game_config(env_id), 3)
    other.reset(seed=0)
    for action in (0, -1, games.num_actions):  # taken (a full column), out of range
        obs = games.obs
        with pytest.raises(ValueError, match=rf"game 0: action {action}\b"):
            games.step(np.array([action]))
        assert games.obs is obs
    for action in (-1, 99):
        obs = other.obs
        with pytest.raises(ValueError, match=rf"game 2: action {action}\b"):
            other.step(np.array([1, 1, action]))
        assert other.obs is obs
    with pytest.raises(ValueError):
        games.step(np.array([1, 2]))  # one action per game
    games.close()
    other.close()


@pytest.mark.parametrize("env_id", GAME_MODULES)
def test_the_rules_know_which_moves_win_as_pettingzoo_does(env_id):
    """Over random games, a move ends the game with a win for its seat exactly when the
    rules said it would; this ties the rules' reading of the planes to PettingZoo's."""
    rules = GAME_RULES[env_id]
    games = GameVector(game_config(env_id), 16)
    games.reset(seed=5)
    rng = np.random.default_rng(5)
    random = make_baseline("random", env_id)
    wins_seen = 0
    for _ in range(250):
        own, opp = rules.planes(games.obs)
        assert not rules.has_line(own).any() and not rules.has_line(opp).any()  # all live
        actions = random.act(games.obs, games.mask, rng)
        predicted = rules.winning_moves(games.obs, games.mask)[np.arange(16), actions]
        mover = games.to_move
        step = games.step(actions)
        won = step.ended & (step.rewards[np.arange(16), mover] == 1)
        assert np.array_equal(predicted, won)
        wins_seen += int(won.sum())
    assert wins_seen > 50
    full = np.zeros((1, rules.cells), bool)
    full[0, np.flatnonzero(rules.lines[0])] = True
    assert rules.has_line(full).all()
    games.close()


# --- baselines ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "env_id", "moves", "expected"),
    [
        # Seat 0 holds cells 0 and 1, seat 1 cells 3 and 4: seat 0 wins at 2 (not 5).
        ("heuristic", TICTACTOE, [0, 3, 1, 4], 2),
        ("minimax", TICTACTOE, [0, 3, 1, 4], 2),
        # Seat 0 on the bottom row's 0, 1, 2 and seat 1 three high in column 6.
        ("heuristic", CONNECT_FOUR, [0, 6, 1, 6, 2, 6], 3),
        # Seat 1 (to move) three high in column 2, seat 0 scattered.
        ("heuristic", CONNECT_FOUR, [0, 2, 4, 2, 6, 2, 0], 2),
        # Seat 1 (to move) on a rising diagonal from column 3's bottom, whose top end is
        # where column 6's next piece lands, and on the second row's columns 4 to 6.
        ("heuristic", CONNECT_FOUR, [0, 3, 4, 4, 5, 5, 0, 5, 6, 6, 6], (3, 6)),
    ],
)
def test_a_baseline_wins_at_once_when_it_can(name, env_id, moves, expected):
    baseline = make_baseline(name, env_id)
    allowed = expected if isinstance(expected, tuple) else (expected,)
    for action in allowed:
        games = scripted(env_id, moves)
        chosen = {
            int(baseline.act(games.obs, games.mask, np.random.default_rng(seed))[0])
            for seed in range(20)
        }
        assert chosen <= set(allowed)
        mover = int(games.to_move[0])
        step = games.step(np.array([action]))
        assert step.ended[0] and step.rewards[0, mover] == 1
        games.close()


@pytest.mark.parametrize(
    ("name", "env_id", "moves", "expected"),
    [
        # Seat 1 holds 3 and 4, seat 0 holds 0 and 8 with no line to make: block at 5.
        ("heuristic", TICTACTOE, [0, 3, 8, 4], 5),
        ("minimax", TICTACTOE, [0, 3, 8, 4], 5),
        # Seat 0 three high in column 0; seat 1 (to move) has no win: block column 0.
        ("heuristic", CONNECT_FOUR, [0, 6, 0, 5, 0], 0),
        # Seat 0 on the bottom row's 1, 2, 3 with both ends open: block one of them.
        ("heuristic", CONNECT_FOUR, [1, 1, 2, 2, 3], (0, 4)),
    ],
)
def test_a_baseline_blocks_an_immediate_loss(name, env_id, moves, expected):
    baseline = make_baseline(name, env_id)
    games = scripted(env_id, moves)
    allowed = expected if isinstance(expected, tuple) else (expected,)
    chosen = {
        int(baseline.act(games.obs, games.mask, np.random.default_rng(seed))[0])
        for seed in range(20)
    }
    assert chosen <= set(allowed)
    games.close()


def test_the_heuristic_beats_random_at_connect_four_on_either_seat():
    heuristic = make_baseline("heuristic", CONNECT_FOUR)
    random = make_baseline("random", CONNECT_FOUR)
    as_first = play(CONNECT_FOUR, (heuristic, random), 100, seed=11)
    as_second = -play(CONNECT_FOUR, (random, heuristic), 100, seed=12)
    wins = np.concatenate([as_first, as_second]) == 1
    assert wins.mean() > 0.8, wins.mean()


@pytest.mark.parametrize("opponent", ["random", "heuristic"])
def test_minimax_never_loses_at_tictactoe(opponent):
    minimax = make_baseline("minimax", TICTACTOE)
    other = make_baseline(opponent, TICTACTOE)
    as_first = play(TICTACTOE, (minimax, other), 200, seed=21)
    as_second = -play(TICTACTOE, (other, minimax), 200, seed=22)
    assert (as_first >= 0).all() and (as_second >= 0).all()
    assert (as_first == 1).mean() > 0.5  # and it wins what it can


def test_minimax_against_itself_always_draws():
    minimax = make_baseline("minimax", TICTACTOE)
    assert (play(TICTACTOE, (minimax, minimax), 100, seed=31) == 0).all()


@pytest.mark.parametrize(
    ("name", "env_id"),
    [
        ("alphazero", TICTACTOE),
        ("minimax", CONNECT_FOUR),
        ("heuristic", "pettingzoo.classic.go_v5"),
    ],
)
def test_a_baseline_without_rules_for_the_game_is_refused(name, env_id):
    with pytest.raises(ConfigError) as err:
        make_baseline(name, env_id)
    assert err.value.field == "policy.other.league.baselines"


def test_a_baseline_is_checked_against_the_game_by_name_alone_naming_the_field():
    # What a job's submission runs: nothing is imported or made for the game.
    check_baseline("heuristic", CONNECT_FOUR, "policy.other.league.eval_vs.0")
    check_baseline("random", "pettingzoo.classic.no_such_game_v1", "x")
    for name, env_id in [("minimax", CONNECT_FOUR), ("heuristic", "pettingzoo.classic.go_v5")]:
        with pytest.raises(ConfigError) as err:
            check_baseline(name, env_id, "policy.other.league.eval_vs.0")
        assert err.value.field == "policy.other.league.eval_vs.0"
        assert "no rules for" in err.value.message


def test_random_plays_any_game_and_refuses_a_position_without_moves():
    random = make_baseline("random", "pettingzoo.classic.go_v5")
    rng = np.random.default_rng(0)
    mask = np.array([[0, 1, 0, 1], [0, 0, 1, 0]], np.float32)
    picks = np.array([random.act(np.zeros((2, 3)), mask, rng) for _ in range(50)])
    assert set(picks[:, 0]) == {1, 3} and set(picks[:, 1]) == {2}
    with pytest.raises(ValueError):
        random.act(np.zeros((1, 3)), np.zeros((1, 4)), rng)
