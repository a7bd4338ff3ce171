"""Each observation kind through the services: images (MiniGrid learned by PPO; Atari
Pong collected, trained and evaluated by IMPALA and DQN), Discrete observations
(FrozenLake learned by DQN) and Dict observations (a Dict CartPole learned by DQN)."""

from pathlib import Path

import numpy as np
import pytest

from common.config import deep_merge
from common.frames import POOL
from common.storage import SharedStore
from common.video import decode
from drover.local import LocalCluster
from jobconfig import load_config_file
from tests.helpers import wait_for_end

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]


def run_to_end(cluster, config, timeout_s):
    job_id = cluster.client.submit_job(config).job_id
    return job_id, wait_for_end(cluster, job_id, timeout_s)


@pytest.mark.learning
def test_ppo_learns_minigrid_from_its_image_view(tmp_path):
    config = load_config_file(ROOT / "examples" / "minigrid_ppo.yaml")
    with LocalCluster(tmp_path / "run", num_collectors=2) as cluster:
        _, status = run_to_end(cluster, config, 240)
    assert status.phase == "succeeded", status
    assert status.last_eval.return_mean >= 0.9


@pytest.mark.learning
def test_dqn_learns_frozenlake_from_discrete_observations(tmp_path):
    config = deep_merge(
        load_config_file(ROOT / "examples" / "cartpole_dqn.yaml"),
        {
            "env": {
                "env_id": "FrozenLake-v1",
                "env_kwargs": {"is_slippery": False},
                "stop_value": 1.0,
                "n_evaluator_episode": 5,
            },
            "policy": {
                "model": {"encoder_hidden_size_list": [64]},
                "other": {"eps": {"decay": 3000}},
            },
        },
    )
    with LocalCluster(tmp_path / "run", num_collectors=1) as cluster:
        _, status = run_to_end(cluster, config, 180)
    assert status.phase == "succeeded", status
    assert status.last_eval.return_mean == 1.0


@pytest.mark.learning
def test_dqn_learns_a_dict_observation_env(tmp_path):
    config = deep_merge(
        load_config_file(ROOT / "examples" / "cartpole_dqn.yaml"),
        {"env": {"env_id": "DroverDictCartPole-v0"}},
    )
    # The operator's env module, as DROVER_ENV_MODULES names it to every service.
    modules = {"DROVER_ENV_MODULES": "tests.dict_env", "PYTHONPATH": str(ROOT)}
    with LocalCluster(tmp_path / "run", num_collectors=1, extra_env=modules) as cluster:
        _, status = run_to_end(cluster, config, 180)
    assert status.phase == "succeeded", status
    assert status.last_eval.return_mean >= 195


def pong(example, manager, **budget):
    return deep_merge(
        load_config_file(ROOT / "examples" / example),
        {
            "env": {
                "manager": manager,
                "double_buffer": manager != "sync",
                "collector_env_num": 4,
                "evaluator_env_num": 1,
                "n_evaluator_episode": 1,
                "stop_value": None,  # a short budget: the job ends by it
            },
            "system": {"collector_num": 1, **budget},
        },
    )


def test_impala_dqn_and_ppo_run_pong_from_pixels_through_the_services(tmp_path):
    pytest.importorskip("envpool")
    # IMPALA steps its envs in worker processes, DQN with envpool's threads; both
    # double-buffered. Each budget leaves a whole evaluation game (about 10 s here)
    # time to finish before it runs out.
    impala = pong("pong_impala.yaml", "async", max_env_step=8000)
    impala = deep_merge(
        impala,
        {
            "policy": {
                "learn": {"batch_size": 8},
                # A video of its first evaluation: a game of Pong from pixels, rendered.
                "eval": {"evaluator": {"eval_freq": 2}, "video_every": 1000},
                "other": {"replay_buffer": {"min_size_to_sample": 8}},
            }
        },
    )
    dqn = deep_merge(
        pong("pong_dqn.yaml", "envpool", max_env_step=3000),
        {
            "policy": {
                "eval": {"evaluator": {"eval_freq": 50}},
                "other": {"replay_buffer": {"min_size_to_sample": 500}},
            }
        },
    )
    # PPO's rounds: the sync workflow steps its envs in turn, with the sync manager.
    ppo = deep_merge(
        pong("pong_ppo.yaml", "sync", max_env_step=1536),
        {
            "policy": {
                "learn": {"batch_size": 64, "epoch_per_collect": 1},
                "collect": {"n_sample": 256},
                "eval": {"evaluator": {"eval_freq": 4}},
            }
        },
    )
    with LocalCluster(tmp_path / "run", num_collectors=1) as cluster:
        store = SharedStore(cluster.shared_dir)
        for config in (impala, dqn, ppo):
            job_id, status = run_to_end(cluster, config, 300)
            assert status.phase == "succeeded", status
            budget = config["system"]["max_env_step"]
            assert status.train_iters > 0 and status.env_steps >= budget
            # An evaluation played a whole game: Pong's unclipped score, -21..21.
            assert status.last_eval is not None
            assert -21 <= status.last_eval.return_mean <= 21
            assert status.last_eval.return_mean != 0
            segments = [
                f"{job_id}/segments/{folder}/{name}"
                for folder in store.list_dir(f"{job_id}/segments")
                for name in store.list_dir(f"{job_id}/segments/{folder}")
            ]
            # The ended job's buffer releases its segments while we look: read one
            # that is still there, if any is.
            for segment in segments:
                try:
                    columns = store.read_segment(segment)
                except FileNotFoundError:
                    continue
                assert columns[POOL].dtype == np.uint8 and "obs" not in columns
                break
            if config is impala:
                evals = cluster.client.metrics(job_id)["evals"]
                (video,) = [e["video"] for e in evals if e["video"]]
                frames = decode(store.read_bytes(video), "mp4")
                assert frames.shape[1:] == (210, 160, 3) and len(frames) > 100  # a game
