"""bench/selfplay.py's head-to-head games: each seat plays exactly the games asked for,
results are from the player's side, and draws count half or whole as the score says."""

import math

import pytest

from bench.selfplay import Tally, baseline_chooser, head_to_head, total
from common.config import EnvConfig
from common.games import TICTACTOE, make_baseline

pytest.importorskip("pettingzoo", reason="the games extra: pip install 'drover[games]'")
pytestmark = pytest.mark.filterwarnings("ignore:The old environment creation API")

TTT = EnvConfig(env_id=TICTACTOE, adapter="pettingzoo")


def test_tally_scores_draws_half_or_whole() -> None:
    tally = Tally(wins=6, draws=2, losses=2)
    assert tally.rate("win_rate") == pytest.approx(0.7)
    assert tally.rate("draw_or_win") == pytest.approx(0.8)
    assert math.isnan(Tally().rate("win_rate"))
    assert total((Tally(1, 2, 3), Tally(4, 5, 6))) == Tally(5, 7, 9)


def test_minimax_against_itself_draws_every_game_on_both_seats() -> None:
    minimax = baseline_chooser(make_baseline("minimax", TICTACTOE))
    first, second = head_to_head(minimax, minimax, TTT, games_per_seat=30)
    assert first == Tally(draws=30) and second == Tally(draws=30)


def test_results_are_the_players_and_each_seat_gets_its_games() -> None:
    random = baseline_chooser(make_baseline("random", TICTACTOE))
    minimax = baseline_chooser(make_baseline("minimax", TICTACTOE))
    # More games than slots: slots start new games until each seat has its share.
    weak = head_to_head(random, minimax, TTT, games_per_seat=80, seed=3)
    strong = head_to_head(minimax, random, TTT, games_per_seat=80, seed=3)
    assert [t.games for t in weak + strong] == [80, 80, 80, 80]
    assert total(weak).wins == 0 and total(weak).losses > 0
    assert total(strong).losses == 0 and total(strong).wins > 0
