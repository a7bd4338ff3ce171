"""PPO's running normalization (`policy.normalize`): statistics kept in the network
and updated by the learner after each round, rewards scaled by the collectors with the
version's return spread, the discounted-return column only where it is asked for."""

import numpy as np
import pytest
import torch

from algorithms.normalize import PRIOR_COUNT, RunningMeanStd
from algorithms.ppo import COLUMNS
from algorithms.ppo.actor import ActorCriticPolicy
from algorithms.ppo.learner import PPO
from algorithms.registry import ALGORITHMS
from common.advantages import DISCOUNTED_RETURN, DiscountedReturns
from common.config import ConfigError
from common.models import state_to_numpy
from jobconfig import resolve_job_config, with_spaces

NORMALIZED = {"obs": True, "reward": True}


def policy_config(normalize=None, **model):
    raw = {"policy": {"type": "ppo", "normalize": normalize or {}, "model": model}}
    config, _ = resolve_job_config(raw)
    return with_spaces(config, 3, 1, "continuous", ([-1.0], [1.0])).policy


def round_of(n=256, seed=0, loc=5.0, scale=3.0):
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(loc, scale, size=(n, 3)).astype(np.float32),
        "action": rng.uniform(-1, 1, size=(n, 1)).astype(np.float32),
        "logp": np.full(n, -1.0, np.float32),
        "adv": rng.normal(size=n).astype(np.float32),
        "ret": rng.normal(size=n).astype(np.float32),
        DISCOUNTED_RETURN: rng.normal(0.0, 40.0, size=n).astype(np.float32),
    }


def test_running_statistics_merged_batch_by_batch_are_those_of_all_values():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 4)) for n in (7, 100, 1, 50)]
    norm = RunningMeanStd((4,))
    for b in batches:
        norm.update(torch.as_tensor(b))
    every = np.concatenate(batches)
    np.testing.assert_allclose(norm.mean.numpy(), every.mean(0), rtol=1e-5)
    np.testing.assert_allclose(norm.var.numpy(), every.var(0), rtol=1e-4)
    assert float(norm.count) == pytest.approx(len(every) + PRIOR_COUNT)


def test_standardized_values_are_clipped():
    norm = RunningMeanStd((), clip=2.0)
    norm.update(torch.tensor([0.0, 2.0]))  # mean ~1, std ~1
    out = norm(torch.tensor([1.0, 100.0, -100.0]))
    assert out[0].abs() < 1e-3 and out[1] == 2.0 and out[2] == -2.0


def test_discounted_returns_restart_where_an_episode_ended():
    returns = DiscountedReturns(2, 0.5)
    np.testing.assert_allclose(returns.step(np.array([1.0, 2.0]), np.array([False, True])), [1, 2])
    np.testing.assert_allclose(
        returns.step(np.array([1.0, 1.0]), np.array([False, False])), [1.5, 1]
    )


def test_the_discounted_return_column_is_declared_only_where_rewards_are_normalized():
    spec = ALGORITHMS["ppo"]
    assert DISCOUNTED_RETURN not in spec.column_names_for(policy_config())
    assert DISCOUNTED_RETURN not in COLUMNS
    assert DISCOUNTED_RETURN in spec.column_names_for(policy_config({"reward": True}))


def test_a_round_is_trained_with_the_statistics_it_was_collected_with_then_added_to_them():
    torch.manual_seed(0)
    ppo = PPO(policy_config(NORMALIZED))
    data = round_of()
    # The collector acted with the version's (initial) statistics: the learner's first
    # minibatch sees the same probabilities, ratio 1.
    with torch.no_grad():
        dist = ppo.model.distribution(torch.as_tensor(data["obs"]))
        data["logp"] = ppo.model.log_prob(dist, torch.as_tensor(data["action"])).numpy()
    loss, stats = ppo.loss({k: torch.as_tensor(v) for k, v in data.items()})
    assert stats["policy/approx_kl"] == pytest.approx(0.0, abs=1e-6)
    info = ppo.train_round(data, seed=0)
    norm = ppo.model.obs_norm
    np.testing.assert_allclose(norm.mean.numpy(), data["obs"].mean(0), rtol=1e-3)
    assert float(ppo.model.return_norm.var.sqrt()) == pytest.approx(
        data[DISCOUNTED_RETURN].std(), rel=1e-3
    )
    assert info.scalars["normalize/return_std"] == pytest.approx(
        data[DISCOUNTED_RETURN].std(), rel=1e-3
    )


def test_a_published_version_acts_and_scales_rewards_with_the_learners_statistics():
    torch.manual_seed(0)
    config = policy_config(NORMALIZED, activation="relu", ortho_init=False, log_std_init=-2.0)
    ppo = PPO(config)
    data = round_of()
    ppo.train_round(data, seed=0)
    actor = ActorCriticPolicy(config)
    assert torch.all(actor.network.log_std == -2.0)  # log_std_init, before loading
    actor.load(1, state_to_numpy(ppo.online))  # what a policy file holds
    obs = data["obs"][:5]
    with torch.no_grad():
        expected = ppo.model.mode(torch.as_tensor(obs)).numpy()
    rng = np.random.default_rng(0)
    np.testing.assert_allclose(actor.greedy(obs, rng), np.clip(expected, -1, 1), rtol=1e-5)
    std = float(ppo.model.return_norm.var.sqrt())
    np.testing.assert_allclose(actor.scale_rewards(np.array([std, 1e9])), [1.0, 10.0], rtol=1e-4)
    assert isinstance(actor.network.actor[0][1], torch.nn.ReLU)


def test_without_normalization_rewards_pass_as_they_are():
    actor = ActorCriticPolicy(policy_config())
    reward = np.array([3.0, -7.0], np.float32)
    assert actor.scale_rewards(reward) is reward
    assert actor.network.obs_norm is None and actor.network.return_norm is None


def test_reward_normalization_outside_the_sync_workflow_is_refused_naming_the_key():
    raw = {
        "policy": {"type": "ppo", "normalize": {"reward": True}},
        "system": {"workflow": "async"},
    }
    with pytest.raises(ConfigError, match="policy.normalize.reward"):
        resolve_job_config(raw)


def test_the_rounds_loop_scales_rewards_by_the_versions_spread_and_ships_the_returns(tmp_path):
    """A published version whose return spread is 4 and whose critic says 0 everywhere,
    with GAE's lambda 0: each advantage is the step's reward divided by 4, while the
    discounted-return column holds the env's own rewards, discounted."""
    from common.messages import PolicyRef
    from common.storage import SharedStore
    from tests.algorithm_runs import JOB, collect_one_segment, job_config

    torch.manual_seed(0)
    rounds = {"normalize": {"reward": True}, "collect": {"n_sample": 64, "gae_lambda": 0.0}}
    config = job_config("ppo", "continuous", policy=rounds)
    learner = PPO(config.policy)
    with torch.no_grad():
        learner.model.return_norm.var.fill_(16.0)  # a spread of 4
        learner.model.critic[-1].weight.zero_()
        learner.model.critic[-1].bias.zero_()
    store = SharedStore(tmp_path)
    path, sha = store.write_policy(JOB, 1, 0, "ppo", state_to_numpy(learner.online))
    ref = PolicyRef(version=1, path=path, sha256=sha, train_iter=0)
    _, columns = collect_one_segment(store, config, ref)
    envs = 2  # collect_one_segment's
    returns = columns[DISCOUNTED_RETURN].reshape(-1, envs)  # [steps, envs], no episode ends
    gamma = config.policy.discount_factor
    rewards = returns - gamma * np.concatenate([np.zeros((1, envs)), returns[:-1]])
    assert rewards.max() <= 0.0 and rewards.min() < -0.5  # Pendulum's own rewards
    np.testing.assert_allclose(columns["adv"].reshape(-1, envs), rewards / 4, atol=1e-4)
