"""Self-play to its targets through the real services: the Connect Four and tic-tac-toe
examples, each trained by a coordinator, 2 collectors and a learner, then its policy
played against fixed opponents outside the services.

    python bench/selfplay.py [--games connect_four,tictactoe] [--budget-s S]
                             [--eval-games 200] [--plot-out /tmp/selfplay-rating.png]

For each game, one job:

- `LocalCluster(run_dir, num_collectors=2)` (the processes `drover run` starts) and
  the example submitted unchanged; timed from before the first process starts until
  the job has ended (succeeded at its `policy.other.league.stop`, or its
  `system.max_env_step`), or stopped at `--budget-s`.
- While it runs, `client.job` and `client.league` are polled every `--poll-s`
  seconds: the env steps, main's rating ordinal (openskill mu - 3 sigma) and the
  baselines' ordinals, and the newest battle evaluation's win rate against the
  heuristic. These make the rating curve written to `--plot-out`.
- At its end: the env steps, the final battle evaluation (the services' own,
  `env.n_evaluator_episode` games against each baseline, half on each seat, draws
  counting half) and main's rating against the baselines' ratings.

Then, outside the services, the job's newest policy file (`client.policy_bytes`) is
loaded into PPO's actor with the job's resolved config (its `job.json`) and plays its
most likely legal move (`actor.greedy`) in `--eval-games` games on each seat against
each opponent of the game (`common.games.GameVector`, a fixed seed):

- Connect Four: random (win rate >= 0.95) and the heuristic (win rate >= 0.6);
- tic-tac-toe: minimax, a perfect player (draw-or-win rate >= 0.9), and random.

A win rate counts a draw as half a win; the draw-or-win rate counts it as a whole one.
The table shows each opponent's wins, draws and losses, the rate on each seat and on
both, the target and whether it was met; a second table each job's wall time and what
the services saw.

Wall times depend on what else runs: the load in the second before the start and the
share of the CPUs other processes took during each job are printed with the tables.
PettingZoo comes with the optional extra `games` (pip install 'drover[games]'); this
bench installs nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learner_scaling import CpuMeter, CpuShares, cpu_line, print_load_before  # noqa: E402
from common.config import EnvConfig  # noqa: E402
from common.games import CONNECT_FOUR, TICTACTOE, Baseline, GameVector, make_baseline  # noqa: E402
from common.messages import JobStatus, LeagueView  # noqa: E402
from common.storage import SharedStore  # noqa: E402
from drover.local import LocalCluster  # noqa: E402
from jobconfig import algorithm_of, load_config_file, read_job_config  # noqa: E402
from services.coordinator.league import Tally as LeagueTally  # noqa: E402

Score = Literal["win_rate", "draw_or_win"]
#: An action chooser: (obs [N, obs_size], mask [N, num_actions], rng) -> [N] actions.
Chooser = Callable[[np.ndarray, np.ndarray, np.random.Generator], np.ndarray]

#: Games played at once in a head-to-head.
HEAD_TO_HEAD_SLOTS = 64
#: How long a stopped job may take to reach its terminal phase.
STOP_WAIT_S = 60.0


@dataclass(frozen=True)
class Check:
    """A head-to-head against one opponent, with what counts as good enough."""

    opponent: str
    score: Score
    #: None: shown, not judged.
    target: float | None


@dataclass(frozen=True)
class Game:
    key: str
    title: str
    env_id: str
    example: Path
    budget_s: float
    checks: tuple[Check, ...]


GAMES = {
    "connect_four": Game(
        key="connect_four",
        title="Connect Four",
        env_id=CONNECT_FOUR,
        example=ROOT / "examples" / "connect_four_selfplay.yaml",
        budget_s=1500.0,
        checks=(Check("random", "win_rate", 0.95), Check("heuristic", "win_rate", 0.6)),
    ),
    "tictactoe": Game(
        key="tictactoe",
        title="tic-tac-toe",
        env_id=TICTACTOE,
        example=ROOT / "examples" / "tictactoe_selfplay.yaml",
        budget_s=600.0,
        checks=(Check("minimax", "draw_or_win", 0.9), Check("random", "win_rate", None)),
    ),
}


# --- head-to-head games outside the services --------------------------------------------


@dataclass
class Tally(LeagueTally):
    """Games of one side (the league's tally), scored two ways."""

    def rate(self, score: Score) -> float:
        """Wins plus draws (a half each for `win_rate`, whole for `draw_or_win`) per game."""
        if self.games == 0:
            return float("nan")
        draw_worth = 0.5 if score == "win_rate" else 1.0
        return (self.wins + draw_worth * self.draws) / self.games

    def add(self, result: float) -> None:
        if result > 0:
            self.wins += 1
        elif result < 0:
            self.losses += 1
        else:
            self.draws += 1


def total(seats: tuple[Tally, Tally]) -> Tally:
    return Tally(*(sum(getattr(t, k) for t in seats) for k in ("wins", "draws", "losses")))


def head_to_head(
    player: Chooser,
    opponent: Chooser,
    env: EnvConfig,
    games_per_seat: int,
    seed: int = 0,
) -> tuple[Tally, Tally]:
    """`games_per_seat` games of `player` on seat 0 (the game's first mover) and as many
    on seat 1 against `opponent`; (seat 0's results, seat 1's), from `player`'s side."""
    rng = np.random.default_rng(seed)
    queue = [0, 1] * games_per_seat  # seats of the games still to start
    slots = max(1, min(HEAD_TO_HEAD_SLOTS, len(queue)))
    games = GameVector(env, slots)
    tallies = (Tally(), Tally())
    try:
        games.reset(seed=seed)
        seat = np.array(queue[:slots], dtype=np.int64)
        del queue[:slots]
        active = np.ones(slots, dtype=bool)
        while active.any():
            ours = games.to_move == seat
            actions = np.zeros(slots, dtype=np.int64)
            for chooser, side in ((player, ours), (opponent, ~ours)):
                rows = np.flatnonzero(side)
                if rows.size:
                    actions[rows] = chooser(games.obs[rows], games.mask[rows], rng)
            step = games.step(actions)
            for i in np.flatnonzero(step.ended & active):
                tallies[seat[i]].add(float(step.rewards[i, seat[i]]))
                if queue:
                    seat[i] = queue.pop()
                else:
                    active[i] = False  # its slot plays on unrecorded until the rest end
    finally:
        games.close()
    return tallies


def baseline_chooser(baseline: Baseline) -> Chooser:
    return lambda obs, mask, rng: baseline.act(obs, mask, rng)


@dataclass
class CheckResult:
    check: Check
    seats: tuple[Tally, Tally]

    @property
    def both(self) -> Tally:
        return total(self.seats)

    @property
    def met(self) -> bool | None:
        target = self.check.target
        return None if target is None else self.both.rate(self.check.score) >= target


def load_policy_chooser(run_dir: Path, job_id: str, data: bytes) -> tuple[Chooser, EnvConfig, int]:
    """The greedy player of a policy file's bytes, built with the job's resolved config
    (as a collector's evaluation builds it); its game's env config and its version."""
    config = read_job_config(SharedStore(run_dir), job_id)
    scratch = SharedStore(run_dir / "bench")
    rel = "newest-policy.safetensors"
    scratch.write_bytes(rel, data)
    policy_file = scratch.read_policy(rel, algo=config.policy.type)
    actor = algorithm_of(config).make_actor(config.policy)
    actor.load(policy_file.version, policy_file.tensors)
    return (
        lambda obs, mask, rng: actor.greedy(obs, rng, mask),  # type: ignore[call-arg]
        config.env,
        policy_file.version,
    )


# --- one job through the services ------------------------------------------------------


@dataclass
class Sample:
    """One poll of a running job."""

    elapsed_s: float
    env_steps: int
    main_ordinal: float
    baseline_ordinals: dict[str, float]


@dataclass
class JobRun:
    game: Game
    status: JobStatus
    league: LeagueView
    wall_s: float
    stopped_at_budget: bool
    samples: list[Sample] = field(default_factory=list)
    #: (env steps, win rate against the heuristic) of every battle evaluation seen.
    heuristic_curve: dict[int, float] = field(default_factory=dict)
    checks: list[CheckResult] = field(default_factory=list)
    policy_version: int | None = None
    lost: CpuShares | None = None


def sample_of(elapsed_s: float, status: JobStatus, league: LeagueView) -> Sample:
    return Sample(
        elapsed_s=elapsed_s,
        env_steps=status.env_steps,
        main_ordinal=league.main.ordinal,
        baseline_ordinals={m.name: m.ordinal for m in league.members if m.kind == "baseline"},
    )


def run_job(
    game: Game, work: Path, budget_s: float, poll_s: float, eval_games: int, console: Console
) -> JobRun:
    config = load_config_file(game.example)
    run_dir = work / game.key
    if run_dir.exists():
        raise FileExistsError(f"{run_dir} exists: give --runs-dir a fresh folder")
    meter = CpuMeter()
    started = time.monotonic()
    cluster = LocalCluster(run_dir, num_collectors=2)
    samples: list[Sample] = []
    curve: dict[int, float] = {}
    try:
        cluster.start()
        job_id = cluster.client.submit_job(config, name=f"bench-{game.key}").job_id
        console.print(f"{game.title}: job {job_id} of {game.example} submitted")
        stop_sent = False
        while True:
            status = cluster.client.job(job_id)
            league = cluster.client.league(job_id)
            elapsed = time.monotonic() - started
            samples.append(sample_of(elapsed, status, league))
            for battle in league.evaluations:
                rate = battle.win_rates.get("heuristic")
                if rate is not None:
                    curve[battle.env_steps] = rate
            if status.phase != "running":
                break
            if elapsed > budget_s and not stop_sent:
                console.print(f"{game.title}: --budget-s {budget_s:.0f} reached; stopping")
                cluster.client.stop_job(job_id)
                stop_sent = True
            if stop_sent and elapsed > budget_s + STOP_WAIT_S:
                raise TimeoutError(f"job {job_id} did not stop within {STOP_WAIT_S:.0f}s")
            time.sleep(1.0 if stop_sent else poll_s)
        wall_s = time.monotonic() - started
        console.print(
            f"{game.title}: job {status.phase} after {wall_s:.0f}s, {status.env_steps:,} env "
            f"steps: {status.reason}"
        )
        data = cluster.client.policy_bytes(job_id)
    finally:
        cluster.stop()
    run = JobRun(game, status, league, wall_s, stop_sent, samples, curve, lost=meter.shares())
    chooser, env, run.policy_version = load_policy_chooser(run_dir, job_id, data)
    for check in game.checks:
        opponent = baseline_chooser(make_baseline(check.opponent, game.env_id))
        seats = head_to_head(chooser, opponent, env, eval_games, seed=12345)
        run.checks.append(CheckResult(check, seats))
    return run


# --- what is printed and drawn ---------------------------------------------------------


def fmt_rate(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.3f}"


def results_table(runs: list[JobRun], eval_games: int) -> Table:
    table = Table(
        title=f"Greedy play of each job's newest policy, {eval_games} games on each seat "
        "(outside the services)"
    )
    for col in ("game", "policy", "opponent", "games", "win", "draw", "loss"):
        table.add_column(col, justify="left" if col in ("game", "opponent") else "right")
    for col in ("as 1st", "as 2nd", "score", "both seats", "target", "met?"):
        table.add_column(col, justify="right")
    for run in runs:
        for result in run.checks:
            check, both = result.check, result.both
            kind = "win rate" if check.score == "win_rate" else "draw-or-win"
            met = {None: "-", True: "[green]yes[/]", False: "[red]NO[/]"}[result.met]
            table.add_row(
                run.game.title,
                f"v{run.policy_version}",
                check.opponent,
                str(both.games),
                str(both.wins),
                str(both.draws),
                str(both.losses),
                fmt_rate(result.seats[0].rate(check.score)),
                fmt_rate(result.seats[1].rate(check.score)),
                kind,
                f"[bold]{fmt_rate(both.rate(check.score))}[/]",
                "-" if check.target is None else f">= {check.target}",
                met,
            )
    return table


def jobs_table(runs: list[JobRun]) -> Table:
    table = Table(
        title="Each job through the services (coordinator, 2 collectors, learner): its final "
        "battle evaluation (win rates, draws half) and openskill ordinals"
    )
    for col in (
        "game",
        "phase",
        "wall s",
        "env steps",
        "train iters",
        "battle of",
        "vs random",
        "vs heuristic",
        "rating: main",
        "random",
        "heuristic",
        "others' CPU",
    ):
        table.add_column(col, justify="left" if col in ("game", "phase") else "right")
    for run in runs:
        status, league = run.status, run.league
        battle = league.evaluations[-1] if league.evaluations else None
        ordinals = {m.name: m.ordinal for m in league.members if m.kind == "baseline"}
        phase = status.phase + (" (budget)" if run.stopped_at_budget else "")
        table.add_row(
            run.game.title,
            phase,
            f"{run.wall_s:.0f}",
            f"{status.env_steps:,}",
            f"{status.train_iters:,}",
            "-" if battle is None else f"v{battle.policy_version}",
            fmt_rate(None if battle is None else battle.win_rates.get("random")),
            fmt_rate(None if battle is None else battle.win_rates.get("heuristic")),
            f"{league.main.ordinal:.2f}",
            f"{ordinals['random']:.2f}" if "random" in ordinals else "-",
            f"{ordinals['heuristic']:.2f}" if "heuristic" in ordinals else "-",
            "-" if run.lost is None else f"{run.lost.others:.0%}",
        )
    return table


def plot(runs: list[JobRun], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(7 * len(runs), 4.5), squeeze=False)
    for ax, run in zip(axes[0], runs, strict=True):
        steps = [s.env_steps for s in run.samples]
        ax.plot(steps, [s.main_ordinal for s in run.samples], color="C0", label="main")
        for k, name in enumerate(sorted(run.samples[-1].baseline_ordinals if run.samples else [])):
            ax.plot(
                steps,
                [s.baseline_ordinals.get(name, np.nan) for s in run.samples],
                color=f"C{k + 2}",
                linestyle="--",
                label=name,
            )
        ax.set_xlabel("env steps")
        ax.set_ylabel("rating ordinal (mu - 3 sigma)")
        ax.set_title(f"{run.game.title}: {run.status.phase} in {run.wall_s:.0f}s")
        ax.grid(alpha=0.3)
        right = ax.twinx()
        curve = sorted(run.heuristic_curve.items())
        right.plot(
            [x for x, _ in curve],
            [y for _, y in curve],
            color="C1",
            marker=".",
            label="win rate vs heuristic",
        )
        right.set_ylim(0, 1)
        right.set_ylabel("battle win rate vs heuristic (draws half)")
        lines = ax.get_legend_handles_labels()
        more = right.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], loc="lower right", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--games", default="connect_four,tictactoe", help=f"of {', '.join(GAMES)}, comma-separated"
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        help="seconds each job may train before it is stopped "
        "(default: 1500 for Connect Four, 600 for tic-tac-toe)",
    )
    parser.add_argument("--eval-games", type=int, default=200, help="games on each seat")
    parser.add_argument("--poll-s", type=float, default=2.0, help="seconds between polls")
    parser.add_argument("--plot-out", type=Path, default=Path("/tmp/selfplay-rating.png"))
    parser.add_argument(
        "--example",
        action="append",
        default=[],
        metavar="GAME=PATH",
        help="run this config file instead of the game's example (repeatable)",
    )
    parser.add_argument(
        "--runs-dir", type=Path, help="keep each job's run folder (logs, files) under it"
    )
    args = parser.parse_args()
    args.games = [g.strip() for g in args.games.split(",") if g.strip()]
    if not args.games or any(g not in GAMES for g in args.games):
        parser.error(f"--games: choose from {', '.join(GAMES)}")
    if args.eval_games < 1:
        parser.error("--eval-games must be at least 1")
    examples = {}
    for item in args.example:
        key, _, path = item.partition("=")
        if key not in GAMES or not path:
            parser.error(f"--example {item!r}: give GAME=PATH, GAME one of {', '.join(GAMES)}")
        examples[key] = Path(path)
    args.example = examples
    return args


def main() -> None:
    args = parse_args()
    console = Console(width=170)
    if importlib.util.find_spec("pettingzoo") is None:
        console.print(
            "PettingZoo is not installed: the games come with drover's optional extra "
            "`games`: pip install 'drover[games]'"
        )
        sys.exit(2)
    console.print(cpu_line())
    print_load_before(console)
    runs: list[JobRun] = []
    with tempfile.TemporaryDirectory(prefix="selfplay-bench-") as tmp:
        work = args.runs_dir or Path(tmp)
        for key in args.games:
            game = GAMES[key]
            if key in args.example:
                game = dataclasses.replace(game, example=args.example[key])
            budget_s = args.budget_s if args.budget_s is not None else game.budget_s
            runs.append(run_job(game, work, budget_s, args.poll_s, args.eval_games, console))
    console.print(results_table(runs, args.eval_games))
    console.print(jobs_table(runs))
    for run in runs:
        if run.lost is not None:
            console.print(f"{run.game.title}: during the job, {run.lost}")
    plot(runs, args.plot_out)
    console.print(f"rating curve: {args.plot_out}")


if __name__ == "__main__":
    main()
