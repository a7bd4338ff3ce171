"""Two-player turn-based board games for self-play: PettingZoo's classic games (AEC
API), many stepped together (`GameVector`), their spaces for the job's model
(`game_spaces`), and fixed opponents that need no policy file (`make_baseline`).

One module on purpose (over 600 lines): each baseline's rules are the game's, so a game
and the opponents that play it (random, heuristic, a perfect minimax for tic-tac-toe)
are read together; a new game is a section of it.

A request's `env.env_id` names a game by its module, such as
`pettingzoo.classic.connect_four_v3`. A module name is code to run, so it is checked
against the games drover ships (`GAME_MODULES`) and the operator's
`DROVER_ENV_MODULES` before anything is imported (`check_game_id`); nothing in this
file imports PettingZoo otherwise, so importing it costs a coordinator nothing.

    games = GameVector(config.env, num_games=64)
    games.reset(seed=0)
    baseline = make_baseline("heuristic", config.env.env_id)
    while ...:
        actions = baseline.act(games.obs, games.mask, rng)   # or the policy, per seat
        step = games.step(actions)      # step.rewards [64, 2], step.ended [64]
    games.close()
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from common.config import ConfigError, EnvConfig
from common.env_guard import (
    _MODULE_NAME_RE,
    ENV_MODULES_VAR,
    MAX_ENV_ID_CHARS,
    env_modules_from_env,
)
from common.env_make import Spaces

#: The games drover ships; the operator allows more with `DROVER_ENV_MODULES`.
GAME_MODULES = ("pettingzoo.classic.tictactoe_v3", "pettingzoo.classic.connect_four_v3")

TICTACTOE = "pettingzoo.classic.tictactoe_v3"
CONNECT_FOUR = "pettingzoo.classic.connect_four_v3"

#: Seats: 0 is the game's first agent (`possible_agents[0]`), 1 the second.
SEATS = 2

# PettingZoo's version modules (`connect_four_v3`) warn on import that a registry will
# replace them one day; a service's log has no use for it. A filter for that message
# alone, set once: `catch_warnings` around each import would race other threads.
warnings.filterwarnings(
    "ignore", message="The old environment creation API", category=DeprecationWarning
)


# --- what a request may name ---------------------------------------------------------


def allowed_game_ids(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The game modules a job may name: `GAME_MODULES`, then the operator's."""
    listed = env_modules_from_env(os.environ if environ is None else environ)
    return GAME_MODULES + tuple(name for name in listed if name not in GAME_MODULES)


def check_game_id(env_id: str) -> str:
    """`env_id` if a job may play it; imports nothing.

    Raises:
        ConfigError: on `env.env_id`: not a dotted module name, or not an allowed game
            (the message lists the allowed ones).
    """
    example = f"such as '{CONNECT_FOUR}'"
    if not isinstance(env_id, str) or not env_id:
        raise ConfigError("env.env_id", f"must name a game module {example}")
    if len(env_id) > MAX_ENV_ID_CHARS or not _MODULE_NAME_RE.fullmatch(env_id):
        raise ConfigError(
            "env.env_id",
            f"{env_id[:MAX_ENV_ID_CHARS]!r} is not a dotted Python module name ({example})",
        )
    allowed = allowed_game_ids()
    if env_id not in allowed:
        raise ConfigError(
            "env.env_id",
            f"{env_id!r} is not an allowed game; allowed: {', '.join(allowed)} (the operator "
            f"adds game modules with {ENV_MODULES_VAR})",
        )
    return env_id


@dataclass(frozen=True)
class GameSpec:
    """An allowed game module that makes a fitting game, and what it looks like."""

    env_id: str
    make: Callable[[], Any]  # the module's `env()`: a new AEC env, not yet reset
    agents: tuple[str, str]  # possible_agents: seat 0, seat 1
    board_shape: tuple[int, ...]  # one seat's observation before flattening
    num_actions: int

    @property
    def obs_size(self) -> int:
        return int(np.prod(self.board_shape))


def load_game(env_id: str) -> GameSpec:
    """The game module `env_id` names, imported once it is allowed, with its env checked
    to be a two-player turn-based game that drover can play: a Dict observation of
    `observation` (a Box) and `action_mask`, and Discrete actions.

    Raises:
        ConfigError: on `env.env_id`: not allowed, cannot be imported, or not such a game.
    """
    env_id = check_game_id(env_id)
    try:
        module = importlib.import_module(env_id)
    except ModuleNotFoundError as exc:
        missing = exc.name or env_id
        if missing != "pettingzoo" and (env_id + ".").startswith(missing + "."):
            raise ConfigError("env.env_id", f"there is no module '{env_id}' here") from None
        raise ConfigError(
            "env.env_id",
            f"'{env_id}' needs a package that is not installed: {missing} (PettingZoo "
            "and pygame come with drover's games extra: pip install 'drover[games]')",
        ) from None
    except Exception as exc:  # a broken module
        raise ConfigError(
            "env.env_id", f"'{env_id}' cannot be loaded: {type(exc).__name__}: {exc}"
        ) from None
    make = getattr(module, "env", None)
    if not callable(make):
        raise ConfigError(
            "env.env_id", f"'{env_id}' has no env() function that makes a PettingZoo game"
        )
    try:
        env = make()
    except Exception as exc:
        raise ConfigError(
            "env.env_id", f"cannot make '{env_id}': {type(exc).__name__}: {exc}"
        ) from None
    try:
        return _checked_game(env_id, make, env)
    finally:
        with contextlib.suppress(Exception):  # a throwaway env
            env.close()


def _checked_game(env_id: str, make: Callable[[], Any], env: Any) -> GameSpec:
    def refuse(problem: str) -> ConfigError:
        return ConfigError(
            "env.env_id",
            f"'{env_id}' {problem}; drover plays two-player turn-based PettingZoo games "
            "(AEC) with a Dict observation of 'observation' and 'action_mask' and "
            "Discrete actions",
        )

    pettingzoo = importlib.import_module("pettingzoo")  # the game module imported it
    if not isinstance(env, pettingzoo.AECEnv):
        raise refuse(f"makes a {type(env).__name__}, not a PettingZoo AEC env")
    agents = tuple(env.possible_agents)
    if len(agents) != SEATS:
        raise refuse(f"has {len(agents)} agents")
    shapes = set()
    for agent in agents:
        obs_space, act_space = env.observation_space(agent), env.action_space(agent)
        if not (
            isinstance(obs_space, gym.spaces.Dict)
            and isinstance(obs_space.spaces.get("observation"), gym.spaces.Box)
            and isinstance(obs_space.spaces.get("action_mask"), gym.spaces.Box)
        ):
            raise refuse(f"observes {obs_space}")
        if not isinstance(act_space, gym.spaces.Discrete) or int(act_space.start) != 0:
            raise refuse(f"acts in {act_space}")
        board = tuple(int(d) for d in obs_space["observation"].shape)
        num_actions = int(act_space.n)
        if obs_space["action_mask"].shape != (num_actions,):
            raise refuse(f"has an action mask of shape {obs_space['action_mask'].shape}")
        shapes.add((board, num_actions))
    if len(shapes) != 1:
        raise refuse("gives its two agents different spaces")
    ((board, num_actions),) = shapes
    try:
        env.reset(seed=0)
        mover = env.agent_selection
        masks = {agent: np.asarray(env.observe(agent)["action_mask"]) for agent in agents}
    except Exception as exc:
        raise ConfigError(
            "env.env_id", f"cannot play '{env_id}': {type(exc).__name__}: {exc}"
        ) from None
    waiting = [agent for agent in agents if agent != mover]
    if mover not in agents or not masks[mover].any() or any(masks[a].any() for a in waiting):
        raise refuse("does not give its first position to one agent alone to move")
    return GameSpec(env_id, make, (agents[0], agents[1]), board, num_actions)


def game_spaces(config: EnvConfig) -> Spaces:
    """What a model playing the game is built for: the flattened observation of the seat
    to move, one logit per action, and a legal-action mask with each observation.

    Raises:
        ConfigError: the game is refused, or the config asks for what a game cannot do.
    """
    _check_game_config(config)
    game = load_game(config.env_id)
    return Spaces(
        obs_shape=(game.obs_size,),
        action_shape=game.num_actions,
        action_space="discrete",
        obs_dtype="float32",
        action_mask=True,
        players=SEATS,
    )


def _check_game_config(config: EnvConfig) -> None:
    # A game is made by its module's env() alone: kwargs would reach its constructor
    # (render_mode 'human' opens a window on a headless service), and an obs_key or a
    # frame stack would change what the model sees from what the battle loop gives it.
    if config.env_kwargs:
        raise ConfigError("env.env_kwargs", "a game takes no keyword arguments; leave it empty")
    if config.obs_key is not None:
        raise ConfigError("env.obs_key", "a game's observation is its board planes; leave it out")
    if config.frame_stack not in (None, 1):
        raise ConfigError("env.frame_stack", "a game's position is its whole state; leave it out")


# --- many games stepped together ------------------------------------------------------


@dataclass(frozen=True)
class GameStep:
    """What one move in each game gave."""

    #: [num_games, 2] float32: what each seat (0 = the game's first agent, 1 = the
    #: second) received from this move: PettingZoo's `env.rewards` after it, ±1 to the
    #: winner and loser at a game's end, 0 otherwise and for a draw.
    rewards: np.ndarray
    #: [num_games] bool: this move ended the game. That game is reset at once, so the
    #: vector's obs, mask and to_move already show its next game's first position.
    ended: np.ndarray


class GameVector:
    """`num_games` games of one two-player turn-based game, each waiting on one seat's
    move; `step` makes one move in every game. Usage::

        games = GameVector(config.env, num_games=64)
        games.reset(seed=0)
        step = games.step(actions)   # actions[i]: a legal move for games.to_move[i]
        games.close()

    `obs`, `mask` and `to_move` are new arrays after each `reset` and `step` (never
    written in place), so what a caller kept from an earlier position stays as it was.
    """

    def __init__(self, config: EnvConfig, num_games: int) -> None:
        if num_games < 1:
            raise ValueError(f"num_games must be at least 1, not {num_games}")
        _check_game_config(config)
        self._game = load_game(config.env_id)
        self.env_id = self._game.env_id
        self.num_games = num_games
        self.obs_size = self._game.obs_size
        self.num_actions = self._game.num_actions
        #: [N, obs_size] float32: the position as the seat to move sees it
        #: (PettingZoo's planes, its own pieces first), flattened.
        self.obs = np.zeros((num_games, self.obs_size), np.float32)
        #: [N, num_actions] float32 0/1: the legal actions of the seat to move.
        self.mask = np.zeros((num_games, self.num_actions), np.float32)
        #: [N] int64: the seat to move, 0 or 1.
        self.to_move = np.zeros(num_games, np.int64)
        self._seat = {agent: seat for seat, agent in enumerate(self._game.agents)}
        self._rng: np.random.Generator | None = None
        self._envs: list[Any] = []
        try:
            for _ in range(num_games):
                self._envs.append(self._game.make())
        except BaseException:
            self.close()
            raise
        # Moves and observations go through the env's wrappers (their checks included);
        # the state they only pass on is read from the raw env, without a lookup through
        # each wrapper's __getattr__ (a fifth of a move's time).
        self._raw = [env.unwrapped for env in self._envs]

    def reset(self, seed: int) -> None:
        """Start every game: game i seeded `seed + i`; the games that follow draw their
        seeds from a generator seeded by `seed`."""
        self._rng = np.random.default_rng(seed)
        obs, mask, to_move = self._new_arrays()
        for i, (env, raw) in enumerate(zip(self._envs, self._raw, strict=True)):
            env.reset(seed=seed + i)
            self._observe(i, env, raw, obs, mask, to_move)
        self._publish(obs, mask, to_move)

    def step(self, actions: np.ndarray) -> GameStep:
        """One move in each game, `actions[i]` by game i's seat to move.

        Raises:
            ValueError: an action is not legal in its game (its mask is 0 or it is out
                of range); nothing is stepped then. The caller must never send one.
        """
        if self._rng is None:
            raise RuntimeError("GameVector.step before reset")
        actions = self._checked_actions(actions)
        rewards = np.zeros((self.num_games, SEATS), np.float32)
        ended = np.zeros(self.num_games, bool)
        obs, mask, to_move = self._new_arrays()
        first, second = self._game.agents
        for i, (env, raw, action) in enumerate(
            zip(self._envs, self._raw, actions.tolist(), strict=True)
        ):
            env.step(action)
            got = raw.rewards
            rewards[i] = got[first], got[second]
            if _game_over(raw):
                ended[i] = True
                env.reset(seed=int(self._rng.integers(2**31 - 1)))
            self._observe(i, env, raw, obs, mask, to_move)
        self._publish(obs, mask, to_move)
        return GameStep(rewards, ended)

    def close(self) -> None:
        envs, self._envs, self._raw = self._envs, [], []
        for env in envs:
            env.close()

    def _checked_actions(self, actions: np.ndarray) -> np.ndarray:
        actions = np.asarray(actions)
        if actions.shape != (self.num_games,) or not np.issubdtype(actions.dtype, np.integer):
            raise ValueError(
                f"actions must be {self.num_games} integers, not {actions.dtype} "
                f"of shape {actions.shape}"
            )
        in_range = (actions >= 0) & (actions < self.num_actions)
        index = np.where(in_range, actions, 0)
        legal = in_range & (self.mask[np.arange(self.num_games), index] > 0)
        if not legal.all():
            game = int(np.flatnonzero(~legal)[0])
            raise ValueError(
                f"game {game}: action {int(actions[game])} is not legal for seat "
                f"{int(self.to_move[game])} (legal: {np.flatnonzero(self.mask[game]).tolist()})"
            )
        return actions

    def _new_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (
            np.empty_like(self.obs),
            np.empty_like(self.mask),
            np.empty_like(self.to_move),
        )

    def _observe(
        self, i: int, env: Any, raw: Any, obs: np.ndarray, mask: np.ndarray, to_move: np.ndarray
    ) -> None:
        agent = raw.agent_selection
        seen = env.observe(agent)  # the env's illegal-move wrapper keeps it for its step
        obs[i] = seen["observation"].reshape(-1)
        mask[i] = seen["action_mask"]
        to_move[i] = self._seat[agent]

    def _publish(self, obs: np.ndarray, mask: np.ndarray, to_move: np.ndarray) -> None:
        stuck = ~(mask > 0).any(axis=1)
        if stuck.any():
            game = int(np.flatnonzero(stuck)[0])
            raise RuntimeError(f"{self.env_id} game {game}: the seat to move has no legal move")
        self.obs, self.mask, self.to_move = obs, mask, to_move


def _game_over(raw: Any) -> bool:
    # Over once either seat is out: the classic games end it for both at once, and a
    # two-player game with one seat left has nobody for it to play.
    terminations, truncations = raw.terminations, raw.truncations
    return any(terminations.values()) or any(truncations.values())


# --- the rules of the shipped games, from the observation planes ---------------------


@dataclass(frozen=True)
class BoardRules:
    """A game of lines on a grid, read from the seat to move's flattened observation
    `[rows, cols, 2]` (plane 0 its own pieces, plane 1 the opponent's, row 0 on top, as
    PettingZoo lays them out): who has a line, and which moves would make one.

    With `gravity` (Connect Four) an action names a column and the piece lands in its
    lowest empty row; without it (tic-tac-toe) an action names the cell `row * cols +
    col`.
    """

    rows: int
    cols: int
    line_length: int
    gravity: bool

    @property
    def cells(self) -> int:
        return self.rows * self.cols

    @property
    def num_actions(self) -> int:
        return self.cols if self.gravity else self.cells

    @functools.cached_property
    def lines(self) -> np.ndarray:
        """[num_lines, cells] float32 0/1: every run of `line_length` cells in a row,
        a column or a diagonal."""
        runs = []
        for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
            for r in range(self.rows):
                for c in range(self.cols):
                    end_r = r + dr * (self.line_length - 1)
                    end_c = c + dc * (self.line_length - 1)
                    if 0 <= end_r < self.rows and 0 <= end_c < self.cols:
                        run = np.zeros(self.cells, np.float32)
                        for k in range(self.line_length):
                            run[(r + dr * k) * self.cols + c + dc * k] = 1.0
                        runs.append(run)
        return np.stack(runs)

    def planes(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[N, cells] bool each: the pieces of the seat to move, and its opponent's."""
        board = np.asarray(obs).reshape(len(obs), self.cells, 2) > 0.5
        return board[:, :, 0], board[:, :, 1]

    def has_line(self, pieces: np.ndarray) -> np.ndarray:
        """[N] bool: these [N, cells] pieces hold a whole line."""
        counts = pieces.astype(np.float32) @ self.lines.T
        return (counts >= self.line_length).any(axis=1)

    def move_cells(self, occupied: np.ndarray) -> np.ndarray:
        """[N, num_actions] int64: the cell each action fills (-1: a full column)."""
        n = len(occupied)
        if not self.gravity:
            return np.broadcast_to(np.arange(self.cells, dtype=np.int64), (n, self.cells))
        height = occupied.reshape(n, self.rows, self.cols).sum(axis=1)
        row = self.rows - 1 - height
        cells = row * self.cols + np.arange(self.cols)
        return np.where(height < self.rows, cells, -1).astype(np.int64)

    def winning_moves(
        self, obs: np.ndarray, mask: np.ndarray, *, for_opponent: bool = False
    ) -> np.ndarray:
        """[N, num_actions] bool: the legal moves with which the seat to move would make
        a line at once; `for_opponent`: those with which its opponent would, if it were
        to move now (the moves that block it)."""
        own, opp = self.planes(obs)
        pieces = opp if for_opponent else own
        cells = self.move_cells(own | opp)
        legal = (np.asarray(mask) > 0.5) & (cells >= 0)
        # An empty cell completes a line when the line's other cells are all `pieces`.
        counts = pieces.astype(np.float32) @ self.lines.T
        almost = (counts == self.line_length - 1).astype(np.float32)
        completes = (almost @ self.lines) > 0  # [N, cells]
        return legal & np.take_along_axis(completes, np.maximum(cells, 0), axis=1)


#: The rules the baselines know, by game module.
GAME_RULES: dict[str, BoardRules] = {
    TICTACTOE: BoardRules(rows=3, cols=3, line_length=3, gravity=False),
    CONNECT_FOUR: BoardRules(rows=6, cols=7, line_length=4, gravity=True),
}


def _pick(allowed: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[N] int64: one of each row's allowed actions, uniformly at random."""
    scores = np.where(allowed, rng.random(allowed.shape), -1.0)
    return scores.argmax(axis=1).astype(np.int64)


def _legal(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    mask = np.asarray(mask)
    if mask.ndim != 2 or len(obs) != len(mask):
        raise ValueError(f"obs {np.shape(obs)} and mask {mask.shape} do not match")
    legal = mask > 0.5
    if not legal.any(axis=1).all():
        raise ValueError("a position has no legal move")
    return legal


# --- baselines: opponents that need no policy file ------------------------------------


class Baseline(Protocol):
    """A fixed opponent: chooses legal moves for a batch of positions. Usage::

    baseline = make_baseline("heuristic", env_id)
    actions = baseline.act(games.obs, games.mask, rng)   # rows where it is to move
    """

    name: str

    def act(self, obs: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """[N] int64 legal actions for N positions (`obs` [N, obs_size], `mask`
        [N, num_actions]) seen by the seat to move."""
        ...


class RandomBaseline:
    """Uniform over the legal moves; plays any game."""

    name = "random"

    def act(self, obs: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return _pick(_legal(obs, mask), rng)


class HeuristicBaseline:
    """Wins at once when it can; else blocks a move with which the opponent would win at
    once; else plays a uniformly random legal move."""

    name = "heuristic"

    def __init__(self, rules: BoardRules) -> None:
        self.rules = rules

    def act(self, obs: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        legal = _legal(obs, mask)
        wins = self.rules.winning_moves(obs, legal)
        blocks = self.rules.winning_moves(obs, legal, for_opponent=True)
        allowed = np.where(
            wins.any(axis=1, keepdims=True),
            wins,
            np.where(blocks.any(axis=1, keepdims=True), blocks, legal),
        )
        return _pick(allowed, rng)


class MinimaxBaseline:
    """A perfect tic-tac-toe player: every move it makes is one of the best by a full
    search of the game tree, chosen at random among those equally good."""

    name = "minimax"

    def __init__(self) -> None:
        self.rules = GAME_RULES[TICTACTOE]
        self._bit = (1 << np.arange(self.rules.cells)).astype(np.int64)

    def act(self, obs: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        legal = _legal(obs, mask)
        own, opp = self.rules.planes(obs)
        best_bits = np.array(
            [
                _tictactoe_best_moves(int(o), int(p))
                for o, p in zip(own @ self._bit, opp @ self._bit, strict=True)
            ],
            np.int64,
        )
        best = ((best_bits[:, None] >> np.arange(self.rules.cells)) & 1).astype(bool)
        return _pick(best & legal, rng)


_TTT_FULL = (1 << 9) - 1
_TTT_LINES = tuple(
    sum(1 << int(cell) for cell in np.flatnonzero(line)) for line in GAME_RULES[TICTACTOE].lines
)


def _ttt_has_line(pieces: int) -> bool:
    return any(pieces & line == line for line in _TTT_LINES)


@functools.cache
def _tictactoe_value(own: int, opp: int) -> int:
    """The outcome for the seat to move under perfect play (+1 win, 0 draw, -1 loss);
    `own` and `opp` are bit sets of cells (bit k: cell k)."""
    return _tictactoe_search(own, opp)[0]


@functools.cache
def _tictactoe_best_moves(own: int, opp: int) -> int:
    """The bit set of the moves that reach `_tictactoe_value` for the seat to move."""
    return _tictactoe_search(own, opp)[1]


def _tictactoe_search(own: int, opp: int) -> tuple[int, int]:
    best_value, best_moves = -2, 0
    empty = _TTT_FULL & ~(own | opp)
    for cell in range(9):
        if not empty >> cell & 1:
            continue
        after = own | 1 << cell
        if _ttt_has_line(after):
            value = 1
        elif after | opp == _TTT_FULL:
            value = 0
        else:
            value = -_tictactoe_value(opp, after)
        if value > best_value:
            best_value, best_moves = value, 1 << cell
        elif value == best_value:
            best_moves |= 1 << cell
    return best_value, best_moves


#: The baselines by name, and the games each has rules for (None: any game).
BASELINE_GAMES: dict[str, tuple[str, ...] | None] = {
    "random": None,
    "heuristic": tuple(GAME_RULES),
    "minimax": (TICTACTOE,),
}


def check_baseline(name: str, env_id: str, field: str = "policy.other.league.baselines") -> None:
    """Refuse a baseline that cannot play the game `env_id`; makes and imports nothing,
    so a job is checked at submission.

    Raises:
        ConfigError: on `field`: an unknown name, or a game the baseline has no rules
            for.
    """
    if name not in BASELINE_GAMES:
        raise ConfigError(
            field, f"unknown baseline {name!r} (known: {', '.join(sorted(BASELINE_GAMES))})"
        )
    games = BASELINE_GAMES[name]
    if games is not None and env_id not in games:
        raise ConfigError(
            field,
            f"the {name!r} baseline has no rules for {env_id!r} (it plays {', '.join(games)})",
        )


def make_baseline(name: str, env_id: str) -> Baseline:
    """The baseline `name` for the game `env_id`.

    Raises:
        ConfigError: on `policy.other.league.baselines`: see `check_baseline`.
    """
    check_baseline(name, env_id)
    if name == "random":
        return RandomBaseline()
    if name == "heuristic":
        return HeuristicBaseline(GAME_RULES[env_id])
    return MinimaxBaseline()
