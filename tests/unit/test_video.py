"""Watching a policy play (common/video.py): an episode rendered frame by frame, as an
MP4 and a GIF that decode to those frames; an env that cannot render says so."""

import numpy as np
import pytest

from common.video import CannotRender, decode, encode, record_episode
from jobconfig import resolve_job_config
from tests.blind_env import ENV_ID


def env_config(env_id):
    config, _ = resolve_job_config({"env": {"env_id": env_id}})
    return config.env


def test_an_episode_is_rendered_and_its_videos_decode_to_its_frames():
    # Always pushing left: CartPole falls within a few dozen steps.
    episode = record_episode(env_config("CartPole-v1"), lambda obs: np.zeros(1, np.int64), 0)
    assert 5 < episode.length < 100 and episode.episode_return == episode.length
    assert len(episode.frames) == episode.length + 1  # the first frame, then one a step
    assert episode.fps == 50 and episode.frames[0].shape == (400, 600, 3)
    mp4 = decode(encode(episode.frames, episode.fps, "mp4"), "mp4")
    assert mp4.shape == (len(episode.frames), 400, 600, 3)
    # Lossy, but the same pictures: the cart and pole, not noise.
    assert np.abs(mp4.astype(int) - np.stack(episode.frames)).mean() < 3
    gif = decode(encode(episode.frames, episode.fps, "gif"), "gif")
    # Every second frame, 320 wide (Pillow merges a frame that repeats the last one).
    assert gif.shape[1:] == (213, 320, 3) and 2 < len(gif) <= (len(episode.frames) + 1) // 2


def test_a_video_and_its_play_end_at_its_frame_limit_or_when_told_to_stop():
    def balance(obs):  # keeps the pole up a while
        return (obs[:, 2] > 0).astype(np.int64)

    episode = record_episode(env_config("CartPole-v1"), balance, 0, max_frames=10)
    assert len(episode.frames) == 10 and episode.length == 9
    told = record_episode(env_config("CartPole-v1"), balance, 0, stop=lambda: True)
    assert told.length == 1 and len(told.frames) == 2


def test_an_env_that_cannot_render_says_so():
    with pytest.raises(CannotRender, match="'DroverBlind-v0' cannot render rgb_array"):
        record_episode(env_config(ENV_ID), lambda obs: np.zeros(1, np.int64), 0)


def test_a_video_writer_encodes_frames_as_they_come_and_keeps_none():
    """The evaluation video's path: frames go to ffmpeg as they are rendered (the episode
    keeps none), and the MP4 and GIF hold what the kept frames' encoding holds."""
    from common.video import VideoWriter

    act = lambda obs: np.zeros(1, np.int64)  # noqa: E731
    kept = record_episode(env_config("CartPole-v1"), act, 0)
    with VideoWriter(("mp4", "gif")) as video:
        streamed = record_episode(env_config("CartPole-v1"), act, 0, sink=video)
    assert streamed.frames == [] and streamed.frame_count == len(kept.frames) == video.frames
    mp4 = decode(video.data["mp4"], "mp4")
    assert mp4.shape == (len(kept.frames), 400, 600, 3)
    assert np.abs(mp4.astype(int) - np.stack(kept.frames)).mean() < 3
    gif = decode(video.data["gif"], "gif")
    assert gif.shape[1:] == (213, 320, 3) and 2 < len(gif) <= (len(kept.frames) + 1) // 2


def test_a_video_writer_that_failed_leaves_no_file_and_no_data():
    from common.video import VideoWriter

    with pytest.raises(RuntimeError), VideoWriter(("mp4",)) as video:
        video.add(np.zeros((10, 10, 3), np.uint8), 30)
        raise RuntimeError("the episode failed")
    assert video.data == {} and not video._path.parent.exists()
