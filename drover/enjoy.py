"""`drover enjoy`: watch a trained policy play (RL Zoo's name for it).

    drover enjoy runs/cartpole_dqn-20261129-201500                 # its job's best policy
    drover enjoy RUN --episodes 3 --out cartpole.mp4                # or .gif
    drover enjoy runs/connect_four-.../job-1a2b --opponent heuristic --seat 1

RUN_OR_POLICY is what `drover export` takes (a run folder with one job, a job's folder,
a policy file). The policy acts as in evaluation (greedy). Where there is a display
(DISPLAY or WAYLAND_DISPLAY) and no `--out`, it plays in a window; elsewhere it writes
a video (MP4 unless `--out` ends in .gif; by default `<job>/videos/enjoy-<version>.mp4`).
A two-player game (a self-play job) is played against `--opponent` (a baseline:
random, heuristic, minimax), the policy on `--seat`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from common.config import ConfigError
from drover.export import ExportError, Source, find_policy
from drover.say import console, error

if TYPE_CHECKING:
    from common.video import VideoWriter


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("enjoy", help="watch a trained policy play: a window, or a video")
    parser.add_argument("source", type=Path, metavar="RUN_OR_POLICY")
    parser.add_argument("--episodes", type=int, default=1, help="episodes (games) to play (1)")
    parser.add_argument("--out", type=Path, help="write this video (.mp4 or .gif) instead")
    parser.add_argument("--seed", type=int, default=0, help="the first episode's seed (0)")
    parser.add_argument(
        "--opponent", default="random", help="a game's opponent: random, heuristic, minimax"
    )
    parser.add_argument("--seat", type=int, choices=[0, 1], default=0, help="a game's seat (0)")


def run(args: argparse.Namespace) -> int:
    from common.video import CannotRender

    if args.episodes < 1:
        return error("--episodes must be at least 1")
    if args.out is not None and args.out.suffix not in (".mp4", ".gif"):
        return error(f"--out {args.out}: a video is .mp4 or .gif")
    try:
        source = find_policy(args.source)
        window = args.out is None and has_display()
        out = None if window else (args.out or default_out(source))
        if out is None:
            returns = play(source, args, None)
        else:
            from common.video import VideoWriter

            fmt = out.suffix.lstrip(".")
            with VideoWriter((fmt,)) as video:  # every episode, encoded as it plays
                returns = play(source, args, video)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(video.data[fmt])
    except (ExportError, ConfigError) as exc:
        return error(str(exc))
    except CannotRender as exc:
        return error(f"{exc}: nothing to watch")
    shown = ", ".join(f"{r:g}" for r in returns)
    where = "in a window" if out is None else f"video: {out}"
    console.print(f"drover: {len(returns)} episodes, returns {shown}; {where}", highlight=False)
    return 0


def has_display() -> bool:
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def default_out(source: Source) -> Path:
    return source.job_dir / "videos" / f"enjoy-{source.policy.version:08d}.mp4"


def play(source: Source, args: argparse.Namespace, video: VideoWriter | None) -> list[float]:
    """Each episode's return; every episode's frames go to `video` one after the other
    (None: in a window)."""
    from common.games import check_baseline, make_baseline
    from common.video import record_episode, record_game

    config = source.config
    actor = source.actor()
    rng = np.random.default_rng(args.seed)
    mode = "human" if video is None else "rgb_array"
    returns: list[float] = []
    game = config.env.adapter == "pettingzoo"
    if game:
        check_baseline(args.opponent, config.env.env_id, field="--opponent")
        opponent = make_baseline(args.opponent, config.env.env_id)
        mine = lambda obs, mask: actor.greedy(obs, rng, mask)  # noqa: E731
        theirs = lambda obs, mask: opponent.act(obs, mask, rng)  # noqa: E731
        players = (mine, theirs) if args.seat == 0 else (theirs, mine)
    for i in range(args.episodes):
        if game:
            episode = record_game(config.env, players, args.seed + i, render_mode=mode, sink=video)
            sign = 1.0 if args.seat == 0 else -1.0  # the policy's result, not seat 0's
            returns.append(sign * episode.episode_return)
        else:
            act = lambda obs: actor.greedy(obs, rng)  # noqa: E731
            episode = record_episode(config.env, act, args.seed + i, render_mode=mode, sink=video)
            returns.append(episode.episode_return)
    return returns
