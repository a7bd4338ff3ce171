"""bench/parity.py's two sides run one example: its keys reach stable-baselines3 under
SB3's names as RL Zoo's tuned MuJoCo settings for SAC (hyperparams/sac.yml)."""

from pathlib import Path

import pytest

from bench.sb3_mujoco import first_eval_steps, sb3_kwargs
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


def test_an_algorithm_without_a_reference_side_is_refused():
    config, _ = resolve_job_config({"policy": {"type": "dqn"}})
    with pytest.raises(ValueError, match="only sac"):
        sb3_kwargs(config)
