"""Observation spaces: what each kind becomes on its way to the network (common/envs.py),
which encoder takes it (common/models.py), and the errors for what is not supported."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from algorithms.registry import ALGORITHMS
from common.config import ConfigError, EnvConfig
from common.env_guard import setup_env_registry
from common.env_make import make_one_env
from common.envs import env_spaces, make_env
from common.models import encoder_kind, make_encoder
from jobconfig import fit_to_env, resolve_job_config

setup_env_registry({})  # ale_py and minigrid


def job(env: dict, policy_type: str = "dqn", **model):
    config, _ = resolve_job_config({"env": env, "policy": {"type": policy_type, "model": model}})
    return fit_to_env(config)


@pytest.mark.parametrize(
    ("env", "shape", "dtype"),
    [
        ({"env_id": "CartPole-v1"}, (4,), "float32"),
        ({"env_id": "PongNoFrameskip-v4"}, (4, 84, 84), "uint8"),  # stacked gray frames
        ({"env_id": "ALE/Breakout-v5", "frame_stack": 2}, (2, 84, 84), "uint8"),
        ({"env_id": "MiniGrid-Empty-5x5-v0", "obs_key": "image"}, (3, 7, 7), "uint8"),
        ({"env_id": "FrozenLake-v1"}, (16,), "float32"),  # Discrete: one-hot
        ({"env_id": "Blackjack-v1"}, (32 + 11 + 2,), "float32"),  # Tuple of Discrete
        ({"env_id": "CartPole-v1", "frame_stack": 3}, (12,), "float32"),
    ],
)
def test_each_observation_kind_has_the_shape_and_dtype_the_model_gets(env, shape, dtype):
    spaces = env_spaces(EnvConfig(**env))
    assert (spaces.obs_shape, spaces.obs_dtype) == (shape, dtype)
    envs = make_env(EnvConfig(**env), 2)
    try:
        obs = envs.reset(seed=0)
        step = envs.step(np.zeros(2, np.int64))
    finally:
        envs.close()
    for array in (obs, step.obs, step.final_obs):
        assert array.shape == (2, *shape) and array.dtype == np.dtype(dtype)


def test_a_discrete_observation_is_one_hot():
    env = make_one_env(EnvConfig(env_id="FrozenLake-v1"), training=False)
    obs, _ = env.reset(seed=0)
    assert obs.sum() == 1.0 and obs[0] == 1.0  # the start square
    env.close()


def test_a_dict_of_vectors_is_taken_whole_and_flattened():
    space = gym.spaces.Dict(
        {"position": gym.spaces.Box(-1, 1, (2,)), "mode": gym.spaces.Discrete(3)}
    )
    from common.env_make import _observation_layout

    layout, box = _observation_layout(space, "test")
    assert box.shape == (5,)
    flat = layout({"position": np.array([0.5, -0.5], np.float32), "mode": 2})
    assert flat.dtype == np.float32 and sorted(flat.tolist()) == [-0.5, 0.0, 0.0, 0.5, 1.0]


@pytest.mark.parametrize(
    ("env", "field", "words"),
    [
        ({"env_id": "MiniGrid-Empty-5x5-v0"}, "env.obs_key", "'image'"),
        ({"env_id": "MiniGrid-Empty-5x5-v0", "obs_key": "imag"}, "env.obs_key", "'image'"),
        ({"env_id": "CartPole-v1", "obs_key": "image"}, "env.obs_key", "not a Dict"),
    ],
)
def test_unsupported_observations_are_refused_naming_the_key(env, field, words):
    with pytest.raises(ConfigError) as err:
        env_spaces(EnvConfig(**env))
    assert err.value.field == field and words in err.value.message


def test_sac_refuses_images_and_an_mlp_refuses_them_too():
    with pytest.raises(ConfigError) as err:
        job({"env_id": "PongNoFrameskip-v4"}, "sac")
    assert err.value.field == "env.env_id"  # SAC needs continuous actions anyway
    with pytest.raises(ConfigError) as err:
        job({"env_id": "PongNoFrameskip-v4"}, "dqn", encoder="mlp")
    assert err.value.field == "policy.model.encoder"
    with pytest.raises(ConfigError) as err:
        job({"env_id": "MiniGrid-Empty-5x5-v0", "obs_key": "image"}, "dqn", encoder="nature_cnn")
    assert err.value.field == "policy.model.encoder" and "conv" in err.value.message
    with pytest.raises(ConfigError) as err:
        job({"env_id": "CartPole-v1"}, "dqn", encoder="conv")
    assert err.value.field == "policy.model.encoder"


@pytest.mark.parametrize(
    ("env", "model", "kind"),
    [
        ({"env_id": "CartPole-v1"}, {}, "mlp"),
        ({"env_id": "PongNoFrameskip-v4"}, {}, "nature_cnn"),
        ({"env_id": "PongNoFrameskip-v4"}, {"encoder": "impala_resnet"}, "impala_resnet"),
        ({"env_id": "MiniGrid-Empty-5x5-v0", "obs_key": "image"}, {}, "conv"),
    ],
)
@pytest.mark.parametrize("algo", ["dqn", "ppo", "impala"])
def test_every_image_algorithm_acts_on_each_observation_kind(env, model, kind, algo):
    config = job(env, algo, encoder_hidden_size_list=[32], **model)
    assert encoder_kind(config.policy.model) == kind
    actor = ALGORITHMS[algo].make_actor(config.policy)
    actor.load(1, {k: v.numpy() for k, v in actor.network.state_dict().items()})
    envs = make_env(config.env, 2)
    try:
        obs = envs.reset(seed=0)
        actions = actor.greedy(obs, np.random.default_rng(0))
        envs.step(actions)
    finally:
        envs.close()
    assert actions.shape == (2,)


def test_a_cnn_scales_uint8_images_to_the_unit_interval():
    config = job({"env_id": "PongNoFrameskip-v4"}, "dqn", encoder_hidden_size_list=[16])
    encoder = make_encoder(config.policy.model)
    assert encoder.scale
    white = torch.full((1, 4, 84, 84), 255, dtype=torch.uint8)
    torch.testing.assert_close(encoder(white), encoder.body(torch.ones(1, 4, 84, 84)))
    assert encoder(white).shape == (1, 16)


def test_atari_training_envs_clip_rewards_and_end_at_a_lost_life_evaluation_does_not():
    config = EnvConfig(env_id="ALE/Breakout-v5", noop_max=0)
    rng = np.random.default_rng(0)

    def play(training):
        env = make_one_env(config, training=training)
        env.reset(seed=1)
        rewards, lives_at_end, steps = [], None, 0
        while steps < 3000:
            _, reward, terminated, truncated, _ = env.step(int(rng.integers(0, 4)))
            rewards.append(reward)
            steps += 1
            if terminated or truncated:
                lives_at_end = env.unwrapped.ale.lives()
                break
        env.close()
        return np.array(rewards), lives_at_end

    train_rewards, train_lives = play(training=True)
    eval_rewards, eval_lives = play(training=False)
    assert set(np.unique(train_rewards)) <= {0.0, 1.0}
    assert train_lives > 0  # the training episode ended at the first lost life
    assert eval_lives == 0  # evaluation plays the whole game
    assert eval_rewards.sum() >= 0
