"""Watching a policy play: one episode rendered to frames (gymnasium's
`render_mode="rgb_array"`), encoded as MP4 (H.264, with the ffmpeg that
imageio-ffmpeg ships in its wheel) or GIF (Pillow, what TensorBoard animates).

    episode = record_episode(config.env, lambda obs: actor.greedy(obs, rng), seed=0)
    mp4 = encode(episode.frames, episode.fps, "mp4")

An env that cannot render frames raises `CannotRender` naming it, at once.
"""

from __future__ import annotations

import io
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from common.config import ConfigError, EnvConfig

#: Frames a video holds at most, and their bytes (frames are kept until encoded): a
#: longer episode's video ends there, and so does its play (its return is so far).
MAX_FRAMES = 3000
MAX_VIDEO_BYTES = 512 << 20
#: Frames a second where the env does not say (`render_fps`).
DEFAULT_FPS = 30
#: A GIF (TensorBoard's) at most this many pixels wide, every `GIF_STRIDE`th frame.
GIF_WIDTH = 320
GIF_STRIDE = 2


#: The names `video_path` gives (with their suffix): the files of a job's `videos/`
#: the coordinator's API serves.
VIDEO_NAME = re.compile(r"eval-\d{8}\.(mp4|gif)")


def video_path(job_id: str, version: int) -> str:
    """Where an evaluation's video of a policy version lives, without its suffix
    (`.mp4`, and the `.gif` TensorBoard shows)."""
    return f"{job_id}/videos/eval-{version:08d}"


class CannotRender(Exception):
    """The env has no `rgb_array` render mode."""


@dataclass
class Episode:
    frames: list[np.ndarray] = field(default_factory=list)
    episode_return: float = 0.0
    length: int = 0
    fps: int = DEFAULT_FPS


def record_episode(
    config: EnvConfig,
    act: Callable[[np.ndarray], np.ndarray],
    seed: int,
    *,
    max_frames: int = MAX_FRAMES,
    render_mode: str = "rgb_array",
    stop: Callable[[], bool] = lambda: False,
) -> Episode:
    """One episode of `act` (a batch of one observation -> a batch of one env action)
    on an env made as evaluation makes it, rendered frame by frame, until it ends, its
    frames reach `max_frames` or MAX_VIDEO_BYTES, or `stop()`; `render_mode="human"`:
    in a window instead (no frames kept).

    Raises:
        CannotRender: the env renders no frames (or has no window).
    """
    from common.env_make import make_one_env

    try:
        env = make_one_env(config, training=False, render_mode=render_mode)
    except ConfigError as exc:  # its constructor takes no render_mode
        raise CannotRender(f"'{config.env_id}' cannot be made to render: {exc}") from None
    try:
        modes = env.metadata.get("render_modes") or []
        if render_mode not in modes:
            raise CannotRender(
                f"'{config.env_id}' cannot render {render_mode} (its render modes: "
                f"{', '.join(modes) or 'none'})"
            )
        keep = render_mode == "rgb_array"
        episode = Episode(fps=int(env.metadata.get("render_fps") or DEFAULT_FPS))
        obs, _ = env.reset(seed=seed)
        if keep:
            frame = env.render()
            if frame is None:
                raise CannotRender(f"'{config.env_id}' rendered no frame")
            episode.frames.append(np.asarray(frame))
        while True:
            action = act(np.asarray(obs)[None])[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            episode.episode_return += float(reward)
            episode.length += 1
            if keep:
                episode.frames.append(np.asarray(env.render()))
                full = len(episode.frames) >= min(
                    max_frames, MAX_VIDEO_BYTES // episode.frames[0].nbytes
                )
            else:
                full = False
            if terminated or truncated or full or stop():
                return episode
    finally:
        env.close()


def record_game(
    config: EnvConfig,
    players: tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], ...],
    seed: int,
    *,
    max_frames: int = MAX_FRAMES,
    render_mode: str = "rgb_array",
) -> Episode:
    """One game of a two-player board game (common/games.py), `players[seat]` moving
    for each seat (a batch of one observation and its legal-action mask -> a batch of
    one move), rendered frame by frame; its return is seat 0's (1 a win, -1 a loss).
    `render_mode="human"`: in a window instead (no frames kept)."""
    from common.games import _game_over, load_game

    game = load_game(config.env_id)
    try:
        env = game.make(render_mode=render_mode)
    except TypeError as exc:
        raise CannotRender(f"'{config.env_id}' cannot render: {exc}") from None
    try:
        episode = Episode(fps=int(env.metadata.get("render_fps") or 2))
        env.reset(seed=seed)
        keep = render_mode == "rgb_array"
        if keep:
            episode.frames.append(np.asarray(env.render()))
        raw = env.unwrapped
        while not _game_over(raw):
            agent = raw.agent_selection
            seen = env.observe(agent)
            obs = np.asarray(seen["observation"], np.float32).reshape(1, -1)
            mask = np.asarray(seen["action_mask"], np.float32)[None]
            env.step(int(players[game.agents.index(agent)](obs, mask)[0]))
            episode.length += 1
            if keep and len(episode.frames) < max_frames:
                episode.frames.append(np.asarray(env.render()))
            elif not keep:
                env.render()
        episode.episode_return = float(raw.rewards[game.agents[0]])
        return episode
    finally:
        env.close()


def encode(frames: list[np.ndarray], fps: int, fmt: str) -> bytes:
    """`frames` (RGB, uint8, H x W x 3) as an MP4 or a GIF file's bytes."""
    if fmt == "gif":
        from PIL import Image

        height, width = frames[0].shape[:2]
        scale = min(1.0, GIF_WIDTH / width)
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        images = [Image.fromarray(f).resize(size) for f in frames[::GIF_STRIDE]]
        out = io.BytesIO()
        images[0].save(
            out,
            format="GIF",
            save_all=True,
            append_images=images[1:],
            duration=round(1000 * GIF_STRIDE / fps),
            loop=0,
        )
        return out.getvalue()
    import imageio_ffmpeg

    # H.264 in yuv420p wants even sides; ffmpeg writes a file: a temp one, read back.
    height, width = (side // 2 * 2 for side in frames[0].shape[:2])
    with tempfile.TemporaryDirectory(prefix="drover-video-") as tmp:
        path = Path(tmp) / "video.mp4"
        writer = imageio_ffmpeg.write_frames(
            str(path),
            (width, height),
            fps=fps,
            codec="libx264",
            pix_fmt_out="yuv420p",
            macro_block_size=2,
        )
        writer.send(None)  # the generator starts
        for frame in frames:
            writer.send(np.ascontiguousarray(frame[:height, :width]))
        writer.close()
        return path.read_bytes()


def decode(data: bytes, fmt: str) -> np.ndarray:
    """A video file's frames, [T, H, W, 3] (what the tests check a video plays by)."""
    if fmt == "gif":
        from PIL import Image, ImageSequence

        with Image.open(io.BytesIO(data)) as gif:
            return np.stack([np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(gif)])
    import imageio_ffmpeg

    with tempfile.TemporaryDirectory(prefix="drover-video-") as tmp:
        path = Path(tmp) / "video.mp4"
        path.write_bytes(data)
        reader = imageio_ffmpeg.read_frames(str(path))
        width, height = next(reader)["size"]
        return np.stack([np.frombuffer(f, np.uint8).reshape(height, width, 3) for f in reader])
