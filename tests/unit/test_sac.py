import numpy as np
import pytest
import torch

from algorithms.sac.learner import SAC
from algorithms.sac.networks import SquashedGaussianActor
from jobconfig import resolve_job_config, with_spaces
from services.collector.step_data import NStepBuilder


def make():
    config, _ = resolve_job_config({"policy": {"type": "sac"}})
    return SAC(with_spaces(config, 3, 1, "continuous", ([-2.0], [2.0])).policy)


def test_squashed_log_prob_matches_the_change_of_variables():
    torch.manual_seed(0)
    config, _ = resolve_job_config({"policy": {"type": "sac"}})
    model = with_spaces(config, 3, 1, "continuous", ([-2.0], [2.0])).policy.model
    actor = SquashedGaussianActor(model)
    obs = torch.randn(5, 3)
    torch.manual_seed(1)
    action, logp = actor.sample(obs)
    torch.manual_seed(1)
    gaussian = actor._gaussian(obs)
    u = gaussian.rsample()
    expected = (gaussian.log_prob(u) - torch.log(1 - torch.tanh(u) ** 2)).sum(-1)
    torch.testing.assert_close(logp, expected, rtol=1e-4, atol=1e-4)
    assert (action.abs() < 1).all()


def test_one_update_moves_actor_critic_and_temperature():
    torch.manual_seed(0)
    sac = make()
    rng = np.random.default_rng(0)
    n = 64
    columns = {
        "obs": rng.normal(size=(n, 3)).astype(np.float32),
        "action": rng.uniform(-1, 1, (n, 1)).astype(np.float32),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": rng.normal(size=(n, 3)).astype(np.float32),
        "done": np.zeros(n, np.float32),
        "discount": np.full(n, 0.99, np.float32),
    }
    actor = [p.detach().clone() for p in sac.actor.parameters()]
    critic = [p.detach().clone() for p in sac.critic.parameters()]
    target = [p.detach().clone() for p in sac.target.parameters()]
    alpha = float(sac.log_alpha.detach())
    info = sac.learn_batch(columns, np.ones(n, np.float32))
    assert np.isfinite(info.loss) and info.td_abs.shape == (n,)
    for before, module in ((actor, sac.actor), (critic, sac.critic), (target, sac.target)):
        assert any(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))
    assert float(sac.log_alpha.detach()) != pytest.approx(alpha)


def test_continuous_actions_keep_their_shape_in_segments():
    builder = NStepBuilder(num_envs=2, nstep=1, gamma=0.9)
    no = np.zeros(2, bool)
    builder.add(
        np.zeros((2, 3)),
        np.array([[0.5], [-0.25]], np.float32),
        np.ones(2),
        np.ones((2, 3)),
        no,
        no,
    )
    rows = builder.take()
    assert rows["action"].dtype == np.float32 and rows["action"].shape == (2, 1)


def test_each_part_learns_at_its_own_rate_when_given():
    config, warnings = resolve_job_config(
        {
            "policy": {
                "type": "sac",
                "learn": {
                    "learning_rate": 1e-3,
                    "learning_rate_q": 2e-3,
                    "learning_rate_alpha": 3e-4,
                },
            }
        }
    )
    assert warnings == []
    sac = SAC(with_spaces(config, 3, 1, "continuous", ([-2.0], [2.0])).policy)
    rates = [
        o.param_groups[0]["lr"]
        for o in (sac.critic_optimizer, sac.actor_optimizer, sac.alpha_optimizer)
    ]
    assert rates == [2e-3, 1e-3, 3e-4]  # the actor's falls back to learning_rate
