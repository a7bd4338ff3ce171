import numpy as np
import pytest
import torch

from algorithms.ppo import COLUMNS
from algorithms.ppo.learner import PPO
from common.advantages import gae
from jobconfig import resolve_job_config, with_spaces
from services.collector.step_data import round_columns


def test_gae_matches_a_hand_computed_case():
    gamma, lam = 0.9, 0.5
    rewards = np.array([[1.0], [2.0], [3.0]])
    values = np.array([[0.5], [1.0], [1.5]])
    next_values = np.array([[1.0], [1.5], [9.9]])  # last: the terminal state's value
    terminated = np.array([[0.0], [0.0], [1.0]])
    ended = terminated
    adv, ret = gae(rewards, values, next_values, terminated, ended, gamma, lam)
    d2 = 3.0 - 1.5  # terminal: no bootstrap
    d1 = 2.0 + 0.9 * 1.5 - 1.0
    d0 = 1.0 + 0.9 * 1.0 - 0.5
    expected = [d0 + 0.45 * (d1 + 0.45 * d2), d1 + 0.45 * d2, d2]
    np.testing.assert_allclose(adv[:, 0], expected)
    np.testing.assert_allclose(ret, adv + values)


def test_gae_bootstraps_truncation_and_stops_at_episode_ends():
    rewards = np.ones((2, 1))
    values = np.zeros((2, 1))
    next_values = np.array([[5.0], [7.0]])
    terminated = np.zeros((2, 1))  # truncated at t=0: ended but not terminal
    ended = np.array([[1.0], [0.0]])
    adv, _ = gae(rewards, values, next_values, terminated, ended, 0.5, 1.0)
    assert adv[0, 0] == pytest.approx(1 + 0.5 * 5.0)  # bootstraps, and does not chain on
    assert adv[1, 0] == pytest.approx(1 + 0.5 * 7.0)


def make(space="discrete", **learn):
    config, _ = resolve_job_config({"policy": {"type": "ppo", "learn": learn}})
    bounds = ([-2.0], [2.0]) if space == "continuous" else None
    shape = 1 if space == "continuous" else 2
    return PPO(with_spaces(config, 3, shape, space, bounds).policy)


def batch(ppo, n=128, seed=0):
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 3)).astype(np.float32)
    with torch.no_grad():
        dist = ppo.model.distribution(torch.as_tensor(obs))
        action = dist.sample()
        logp = ppo.model.log_prob(dist, action)
    return {
        "obs": obs,
        "action": action.numpy(),
        "logp": logp.numpy(),
        "adv": rng.normal(size=n).astype(np.float32),
        "ret": rng.normal(size=n).astype(np.float32),
    }


@pytest.mark.parametrize("space", ["discrete", "continuous"])
def test_one_round_moves_parameters_with_finite_losses(space):
    torch.manual_seed(0)
    ppo = make(space, epoch_per_collect=4, batch_size=32)
    data = batch(ppo)
    before = [p.detach().clone() for p in ppo.model.parameters()]
    info = ppo.train_round(data, seed=0)
    assert info.updates == 4 * 4 and ppo.train_iter == 16
    assert all(np.isfinite(v) for v in (info.loss, info.value_loss, info.entropy, info.approx_kl))
    assert any(not torch.equal(a, b) for a, b in zip(before, ppo.model.parameters(), strict=True))


def test_clipping_bounds_the_policy_step():
    torch.manual_seed(0)
    ppo = make(epoch_per_collect=1, batch_size=128, learning_rate=1e-2)
    data = batch(ppo)
    loss, stats = ppo.loss({k: torch.as_tensor(v) for k, v in data.items()})
    assert stats["policy/approx_kl"] == pytest.approx(0.0, abs=1e-6)  # same policy: ratio 1
    assert stats["policy/clip_fraction"] == 0.0
    data["logp"] = data["logp"] - 1.0  # the data's policy was much less likely: ratio e
    _, stats = ppo.loss({k: torch.as_tensor(v) for k, v in data.items()})
    assert stats["policy/clip_fraction"] == 1.0


def test_round_columns_flatten_time_and_envs():
    config, _ = resolve_job_config({"policy": {"type": "ppo"}})
    t, n = 4, 3
    record = {
        "obs": [np.zeros((n, 5), np.float32)] * t,
        "action": [np.zeros(n, np.int64)] * t,
        "logp": [np.zeros(n, np.float32)] * t,
        "value": [np.zeros(n, np.float32)] * t,
        "reward": [np.ones(n, np.float32)] * t,
        "terminated": [np.zeros(n, bool)] * t,
        "ended": [np.zeros(n, bool)] * t,
        "next_value": [np.zeros(n, np.float32)] * t,
    }
    columns = round_columns(record, config.policy)
    assert {k: v.shape[0] for k, v in columns.items()} == dict.fromkeys(COLUMNS, t * n)
    assert columns["action"].dtype == np.int64 and columns["obs"].shape == (t * n, 5)


def test_next_values_equal_a_critic_pass_on_every_final_observation():
    """The rounds loop passes the critic only where an episode ended; every next value
    is still the critic's value of the step's final observation."""
    from algorithms.ppo.actor import ActorCriticPolicy
    from common.config import EnvConfig
    from common.envs import make_env
    from services.collector.step_data import ended_values, next_values

    config, _ = resolve_job_config({"policy": {"type": "ppo"}})
    actor = ActorCriticPolicy(with_spaces(config, 4, 2, "discrete", None).policy)
    torch.manual_seed(0)
    env = make_env(EnvConfig(env_id="CartPole-v1"), 4)
    obs = env.reset(seed=0)
    values, ended, at_ends, full = [], [], [], []
    for _ in range(60):  # CartPole's random episodes end within it
        action, _, value = actor.sample(obs)
        step = env.step(actor.env_action(action))
        values.append(value)
        ended.append(step.ended)
        at_ends.append(ended_values(actor, step))
        full.append(actor.value(step.final_obs))
        obs = step.obs
    env.close()
    assert np.asarray(ended).any()
    got = next_values(values, ended, at_ends, actor.value(obs))
    np.testing.assert_allclose(got, np.asarray(full), rtol=1e-5, atol=1e-6)
