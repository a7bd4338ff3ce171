"""Watching a policy play: one episode rendered to frames (gymnasium's
`render_mode="rgb_array"`), encoded as MP4 (H.264, with the ffmpeg that
imageio-ffmpeg ships in its wheel) or GIF (Pillow, what TensorBoard animates).

    with VideoWriter(("mp4", "gif")) as video:      # frames encoded as they come
        episode = record_episode(config.env, act, seed=0, sink=video)
    mp4, gif = video.data["mp4"], video.data["gif"]

    episode = record_episode(config.env, act, seed=0)   # or kept: episode.frames
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
from typing import Any, Protocol

import numpy as np

from common.config import ConfigError, EnvConfig

#: Frames a video holds at most, and their bytes where they are kept until encoded
#: (`Episode.frames`; a `VideoWriter` encodes them as they come): a longer episode's
#: video ends there, and so does its play (its return is so far).
MAX_FRAMES = 3000
MAX_VIDEO_BYTES = 512 << 20
#: Frames a second where the env does not say (`render_fps`).
DEFAULT_FPS = 30
#: A GIF (TensorBoard's) at most this many pixels wide, every `GIF_STRIDE`th frame;
#: a `VideoWriter` keeps a GIF's frames (small, one byte a pixel) up to `GIF_FRAMES`.
GIF_WIDTH = 320
GIF_STRIDE = 2
GIF_FRAMES = 600


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
    #: Its frames, where no sink took them.
    frames: list[np.ndarray] = field(default_factory=list)
    episode_return: float = 0.0
    length: int = 0
    fps: int = DEFAULT_FPS
    #: Frames rendered (kept, or handed to the sink).
    frame_count: int = 0

    def take(self, frame: np.ndarray, sink: FrameSink | None) -> None:
        """A rendered frame: to `sink` as it comes, else kept in `frames`."""
        if sink is not None:
            sink.add(frame, self.fps)
        else:
            self.frames.append(frame)
        self.frame_count += 1

    def full(self, max_frames: int) -> bool:
        """Whether it has `max_frames` frames, or its kept ones MAX_VIDEO_BYTES."""
        if self.frames:
            max_frames = min(max_frames, MAX_VIDEO_BYTES // self.frames[0].nbytes)
        return self.frame_count >= max_frames


class FrameSink(Protocol):
    """Where an episode's frames go as they are rendered (`VideoWriter`)."""

    def add(self, frame: np.ndarray, fps: int) -> None: ...


class VideoWriter:
    """Frames encoded as they come: an MP4 by an ffmpeg process fed each frame, and the
    small GIF TensorBoard shows (every `GIF_STRIDE`th frame, `GIF_WIDTH` wide, in a
    256-colour palette, up to `GIF_FRAMES`), so a long episode's video costs a frame's
    memory, not the episode's. `data` holds each format's bytes once the `with` block
    ends without an error; the frames' size and fps are the first frame's.
    """

    def __init__(self, formats: tuple[str, ...]) -> None:
        self.formats = formats
        self.data: dict[str, bytes] = {}
        self.frames = 0
        self._tmp = tempfile.TemporaryDirectory(prefix="drover-video-")
        self._mp4: Any = None
        self._size: tuple[int, int] | None = None  # even (width, height) for H.264
        self._gif: list[Any] = []
        self._fps = DEFAULT_FPS

    def __enter__(self) -> VideoWriter:
        return self

    def add(self, frame: np.ndarray, fps: int) -> None:
        if self._size is None:
            self._size, self._fps = (frame.shape[1] // 2 * 2, frame.shape[0] // 2 * 2), fps
            if "mp4" in self.formats:
                self._mp4 = _mp4_writer(self._path, self._size, fps)
        width, height = self._size
        if self._mp4 is not None:
            self._mp4.send(np.ascontiguousarray(frame[:height, :width]))
        if "gif" in self.formats and self.frames % GIF_STRIDE == 0 and len(self._gif) < GIF_FRAMES:
            self._gif.append(_gif_frame(frame).quantize(256))
        self.frames += 1

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        try:
            if self._mp4 is not None:
                self._mp4.close()
            if kind is None and self.frames:
                if self._mp4 is not None:
                    self.data["mp4"] = self._path.read_bytes()
                if self._gif:
                    self.data["gif"] = _gif_bytes(self._gif, self._fps)
        finally:
            self._tmp.cleanup()

    @property
    def _path(self) -> Path:
        return Path(self._tmp.name) / "video.mp4"


def record_episode(
    config: EnvConfig,
    act: Callable[[np.ndarray], np.ndarray],
    seed: int,
    *,
    max_frames: int = MAX_FRAMES,
    render_mode: str = "rgb_array",
    stop: Callable[[], bool] = lambda: False,
    sink: FrameSink | None = None,
) -> Episode:
    """One episode of `act` (a batch of one observation -> a batch of one env action)
    on an env made as evaluation makes it, rendered frame by frame, until it ends, its
    frames reach `max_frames` (or, kept, MAX_VIDEO_BYTES), or `stop()`; each frame goes
    to `sink` as it is rendered, else into `Episode.frames`; `render_mode="human"`: in
    a window instead (no frames).

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
            episode.take(np.asarray(frame), sink)
        while True:
            action = act(np.asarray(obs)[None])[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            episode.episode_return += float(reward)
            episode.length += 1
            if keep:
                episode.take(np.asarray(env.render()), sink)
            full = keep and episode.full(max_frames)
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
    sink: FrameSink | None = None,
) -> Episode:
    """One game of a two-player board game (common/games.py), `players[seat]` moving
    for each seat (a batch of one observation and its legal-action mask -> a batch of
    one move), rendered frame by frame (to `sink` as they are, else kept); its return
    is seat 0's (1 a win, -1 a loss). `render_mode="human"`: in a window instead."""
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
            episode.take(np.asarray(env.render()), sink)
        raw = env.unwrapped
        while not _game_over(raw):
            agent = raw.agent_selection
            seen = env.observe(agent)
            obs = np.asarray(seen["observation"], np.float32).reshape(1, -1)
            mask = np.asarray(seen["action_mask"], np.float32)[None]
            env.step(int(players[game.agents.index(agent)](obs, mask)[0]))
            episode.length += 1
            if keep and episode.frame_count < max_frames:
                episode.take(np.asarray(env.render()), sink)
            elif not keep:
                env.render()
        episode.episode_return = float(raw.rewards[game.agents[0]])
        return episode
    finally:
        env.close()


def encode(frames: list[np.ndarray], fps: int, fmt: str) -> bytes:
    """`frames` (RGB, uint8, H x W x 3) as an MP4 or a GIF file's bytes."""
    if fmt == "gif":
        return _gif_bytes([_gif_frame(f) for f in frames[::GIF_STRIDE]], fps)
    with VideoWriter(("mp4",)) as video:
        for frame in frames:
            video.add(frame, fps)
    return video.data["mp4"]


def _mp4_writer(path: Path, size: tuple[int, int], fps: int) -> Any:
    """A started ffmpeg writer of H.264 (yuv420p: even sides) to `path`: ffmpeg writes
    a file, read back once it is closed."""
    import imageio_ffmpeg

    writer = imageio_ffmpeg.write_frames(
        str(path), size, fps=fps, codec="libx264", pix_fmt_out="yuv420p", macro_block_size=2
    )
    writer.send(None)  # the generator starts
    return writer


def _gif_frame(frame: np.ndarray) -> Any:
    """A frame as the GIF shows it: at most `GIF_WIDTH` wide."""
    from PIL import Image

    height, width = frame.shape[:2]
    scale = min(1.0, GIF_WIDTH / width)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return Image.fromarray(frame).resize(size)


def _gif_bytes(images: list[Any], fps: int) -> bytes:
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
