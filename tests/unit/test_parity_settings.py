"""bench/parity.py's two sides run one example: its keys reach stable-baselines3 under
SB3's names as RL Zoo's tuned MuJoCo settings (hyperparams/sac.yml; hyperparams/ppo.yml's
Hopper-v3 entry, before RL Zoo moved to MuJoCo v4 in January 2024)."""

from pathlib import Path

import pytest
from torch import nn

from bench.parity import updates_per_env_step
from bench.sb3_mujoco import first_eval_steps, normalize_kwargs, sb3_kwargs, updates_by
from jobconfig import load_config_file, resolve_job_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["hopper_sac.yaml", "halfcheetah_sac.yaml"])
def test_the_sac_examples_are_rl_zoos_settings_on_both_sides(name):
    config, warnings = resolve_job_config(load_config_file(ROOT / "examples" / "mujoco" / name))
    assert warnings == []
    assert sb3_kwargs(config) == {
        "learning_rate": 3e-4,
        "buffer_size": 1_000_000,
        "learning_starts": 10_000,
        "batch_size": 256,
        "tau": 0.005,
        "gamma": 0.99,
        "train_freq": 1,
        "gradient_steps": 1,
        "ent_coef": "auto_1.0",
        "policy_kwargs": {"net_arch": [256, 256]},
    }
    # drover's side: as many samples as inserted items, so one update an env step, and
    # every rate (critic, actor, temperature) the one learning rate.
    learn = config.policy.learn
    assert config.policy.other.replay_buffer.samples_per_insert == learn.batch_size
    assert None is learn.learning_rate_q is learn.learning_rate_policy
    # SB3's first evaluation comes one interval after training began, as drover's does.
    assert first_eval_steps(config, 5_000) == 15_000


def test_the_ppo_example_is_rl_zoos_hopper_settings_on_both_sides():
    raw = load_config_file(ROOT / "examples" / "mujoco" / "hopper_ppo.yaml")
    config, warnings = resolve_job_config(raw)
    assert warnings == []
    kwargs = sb3_kwargs(config)
    assert kwargs == {
        "learning_rate": 9.80828e-05,
        "n_steps": 512,
        "batch_size": 32,
        "n_epochs": 5,
        "gamma": 0.999,
        "gae_lambda": 0.99,
        "clip_range": 0.2,
        "ent_coef": 0.00229519,
        "vf_coef": 0.835671,
        "max_grad_norm": 0.7,
        "normalize_advantage": True,
        "policy_kwargs": {
            "log_std_init": -2.0,
            "ortho_init": False,
            "activation_fn": nn.ReLU,
            "net_arch": {"pi": [256, 256], "vf": [256, 256]},
        },
    }
    # RL Zoo's `normalize: true`: VecNormalize's defaults, with the job's discount.
    assert normalize_kwargs(config) == {
        "norm_obs": True,
        "norm_reward": True,
        "clip_obs": 10.0,
        "clip_reward": 10.0,
        "gamma": 0.999,
    }
    # Both sides count minibatch updates alike: 80 a round of 512 env steps.
    assert updates_by(config, kwargs, 1024) == 160
    assert updates_per_env_step(raw) * 512 == pytest.approx(80)
    assert first_eval_steps(config, 25_000) == 25_000


def test_an_algorithm_without_a_reference_side_is_refused():
    config, _ = resolve_job_config({"policy": {"type": "dqn"}})
    with pytest.raises(ValueError, match="only sac and ppo"):
        sb3_kwargs(config)
