import numpy as np
import pytest
import torch

from algorithms.impala.learner import Impala, vtrace
from common.config import resolve_job_config, with_spaces


def test_vtrace_on_policy_is_the_discounted_return():
    gamma = 0.9
    rewards = torch.tensor([[1.0, 2.0, 3.0]])
    values = torch.tensor([[0.3, 0.2, 0.1]])
    bootstrap = torch.tensor([4.0])
    logp = torch.zeros(1, 3)
    discounts = torch.full((1, 3), gamma)
    out = vtrace(logp, logp, rewards, discounts, values, bootstrap)
    expected = [
        1 + gamma * 2 + gamma**2 * 3 + gamma**3 * 4,
        2 + gamma * 3 + gamma**2 * 4,
        3 + gamma * 4,
    ]
    torch.testing.assert_close(out.vs[0], torch.tensor(expected))
    # the policy-gradient advantage uses the next target: r + gamma * vs_{t+1} - V
    next_vs = torch.tensor([expected[1], expected[2], 4.0])
    torch.testing.assert_close(out.pg_advantages[0], rewards[0] + gamma * next_vs - values[0])


def test_vtrace_clips_and_stops_at_episode_ends():
    rewards = torch.tensor([[1.0, 1.0]])
    values = torch.zeros(1, 2)
    bootstrap = torch.tensor([10.0])
    behaviour = torch.log(torch.tensor([[0.5, 0.5]]))
    target = torch.log(torch.tensor([[1.0, 0.25]]))  # rho = 2 (clipped to 1), 0.5
    discounts = torch.tensor([[0.0, 1.0]])  # the episode ended after step 0
    out = vtrace(behaviour, target, rewards, discounts, values, bootstrap)
    # step 1: rho_bar = 0.5: v_s = 0 + 0.5 * (1 + 10 - 0) = 5.5
    # step 0: no bootstrap across the end: v_s = 1 * (1 + 0) = 1
    torch.testing.assert_close(out.vs[0], torch.tensor([1.0, 5.5]))


def test_one_update_moves_parameters():
    torch.manual_seed(0)
    config, _ = resolve_job_config({"policy": {"type": "impala"}})
    impala = Impala(with_spaces(config, 4, 2).policy)
    rng = np.random.default_rng(0)
    b, t = 6, 8
    columns = {
        "obs": rng.normal(size=(b, t, 4)).astype(np.float32),
        "action": rng.integers(0, 2, (b, t)).astype(np.int64),
        "reward": np.ones((b, t), np.float32),
        "logp": np.full((b, t), np.log(0.5), np.float32),
        "done": (rng.random((b, t)) < 0.1).astype(np.float32),
        "bootstrap_obs": rng.normal(size=(b, 4)).astype(np.float32),
    }
    before = [p.detach().clone() for p in impala.model.parameters()]
    info = impala.learn_batch(columns, np.ones(b, np.float32))
    assert np.isfinite(info.loss) and info.td_abs.shape == (b,)
    assert impala.train_iter == 1
    assert any(
        not torch.equal(x, y) for x, y in zip(before, impala.model.parameters(), strict=True)
    )
    assert info.entropy == pytest.approx(np.log(2), abs=0.05)  # near-uniform first policy
