"""`drover enjoy` without a display: a video of the policy playing, for CartPole,
Pendulum and a game of Connect Four against a baseline; what cannot be watched is one
clear line."""

import pytest
import torch

from algorithms.registry import ALGORITHMS
from common.config import to_dict
from common.models import state_to_numpy
from common.storage import SharedStore
from common.video import decode
from drover.cli import main
from jobconfig import fit_to_env, load_config, resolve_job_config
from tests.blind_env import ENV_ID
from tests.helpers import EXAMPLES

JOB = "job-1"


def job_of(tmp_path, raw):
    """A job folder with `raw`'s config and a policy of a fresh learner's weights."""
    config = fit_to_env(resolve_job_config(raw)[0])
    store = SharedStore(tmp_path)
    store.write_json(f"{JOB}/job.json", to_dict(config))
    learner = ALGORITHMS[config.policy.type].make_learner(config.policy, "cpu")
    path, _ = store.write_policy(JOB, 3, 10, config.policy.type, state_to_numpy(learner.online))
    store.write_json(f"{JOB}/policies/best.json", {"version": 3, "path": path})
    return tmp_path / JOB


@pytest.fixture(autouse=True)
def no_display(monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    torch.manual_seed(0)


@pytest.mark.parametrize(
    ("raw", "size"),
    [
        ({"env": {"env_id": "CartPole-v1"}}, (400, 600)),
        ({"env": {"env_id": "Pendulum-v1"}, "policy": {"type": "sac"}}, (500, 500)),
    ],
    ids=["cartpole", "pendulum"],
)
def test_enjoy_writes_a_video_of_the_policy_playing(tmp_path, capsys, raw, size):
    job_dir = job_of(tmp_path, raw)
    assert main(["enjoy", str(job_dir), "--episodes", "2"]) == 0
    said = capsys.readouterr().err
    assert "drover: 2 episodes, returns " in said
    video = job_dir / "videos" / "enjoy-00000003.mp4"
    assert f"video: {video}" in said
    frames = decode(video.read_bytes(), "mp4")
    assert frames.shape[1:3] == size and len(frames) > 10
    assert frames.std() > 0  # pictures, not a blank


def test_enjoy_plays_a_game_of_connect_four_against_a_baseline(tmp_path, capsys):
    pytest.importorskip("pettingzoo", reason="the games extra is not installed")
    raw, _ = load_config(EXAMPLES / "connect_four_selfplay.yaml")
    job_dir = job_of(tmp_path, raw)
    args = ["enjoy", str(job_dir), "--opponent", "heuristic", "--seat", "1"]
    assert main(args) == 0
    said = capsys.readouterr().err
    assert "drover: 1 episodes, returns " in said
    result = float(said.split("returns ", 1)[1].split(";")[0])
    assert result in (-1.0, 0.0, 1.0)  # the policy's game: lost, drawn or won
    frames = decode((job_dir / "videos" / "enjoy-00000003.mp4").read_bytes(), "mp4")
    assert len(frames) >= 3 and frames.std() > 0  # the board, moves on it
    assert main([*args[:2], "--opponent", "grandmaster"]) == 2
    assert "--opponent: unknown baseline 'grandmaster'" in capsys.readouterr().err


def test_what_cannot_be_watched_is_one_clear_line(tmp_path, capsys):
    job_dir = job_of(tmp_path, {"env": {"env_id": "CartPole-v1"}})
    assert main(["enjoy", str(job_dir), "--out", str(tmp_path / "x.avi")]) == 2
    assert "a video is .mp4 or .gif" in capsys.readouterr().err
    assert main(["enjoy", str(tmp_path / "empty-run")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    blind = job_of(tmp_path / "blind", {"env": {"env_id": ENV_ID}})
    assert main(["enjoy", str(blind)]) == 2
    said = capsys.readouterr().err
    assert f"'{ENV_ID}' cannot render rgb_array (its render modes: none): nothing to watch" in said
