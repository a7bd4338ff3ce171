import numpy as np
import pytest
import torch

from algorithms.dqn.actor import EpsilonSchedule
from algorithms.dqn.learner import DQN
from common.checkpoint_file import Checkpoint, decode_checkpoint, encode_checkpoint
from jobconfig import resolve_job_config, with_spaces
from services.collector.step_data import NStepBuilder
from tests.algorithm_runs import fixed_batch


def make_dqn(**learn):
    config, _ = resolve_job_config({"policy": {"learn": learn, "nstep": 3}})
    return DQN(with_spaces(config, 4, 2).policy)


def test_one_update_moves_parameters_and_reduces_loss_on_a_fixed_batch():
    torch.manual_seed(0)
    dqn = make_dqn(target_update_freq=10_000, learning_rate=1e-2)
    before = [p.detach().clone() for p in dqn.online.parameters()]
    batch = fixed_batch()
    first = dqn.update(batch)
    assert np.isfinite(first.loss) and first.td_abs.shape == (32,)
    assert any(not torch.equal(a, b) for a, b in zip(before, dqn.online.parameters(), strict=True))
    for _ in range(50):
        last = dqn.update(batch)
    assert last.loss < first.loss
    assert dqn.train_iter == 51


def test_target_is_reward_when_done_and_bootstraps_otherwise():
    torch.manual_seed(0)
    dqn = make_dqn()
    batch = fixed_batch(n=8)
    with torch.no_grad():
        next_a = dqn.online(batch.next_obs).argmax(1, keepdim=True)
        next_q = dqn.target(batch.next_obs).gather(1, next_a).squeeze(1)
        q = dqn.online(batch.obs).gather(1, batch.action.unsqueeze(1)).squeeze(1)
    expected = batch.reward + batch.discount * (1 - batch.done) * next_q
    info = dqn.update(batch)
    np.testing.assert_allclose(info.td_abs, (expected - q).abs().numpy(), rtol=1e-5, atol=1e-6)


def test_hard_and_soft_target_updates():
    dqn = make_dqn(target_update_freq=2, learning_rate=1e-2)
    batch = fixed_batch()
    dqn.update(batch)
    assert not all(
        torch.equal(a, b)
        for a, b in zip(dqn.online.parameters(), dqn.target.parameters(), strict=True)
    )
    dqn.update(batch)
    assert all(
        torch.equal(a, b)
        for a, b in zip(dqn.online.parameters(), dqn.target.parameters(), strict=True)
    )
    soft = make_dqn(target_theta=0.5)
    t0 = [p.clone() for p in soft.target.parameters()]
    soft.update(batch)
    for t_before, t_after, o in zip(
        t0, soft.target.parameters(), soft.online.parameters(), strict=True
    ):
        torch.testing.assert_close(t_after, 0.5 * t_before + 0.5 * o.detach())


def test_state_dict_round_trip_resumes_exactly(tmp_path):
    dqn = make_dqn()
    for _ in range(3):
        dqn.update(fixed_batch())
    data = encode_checkpoint(Checkpoint(model=dqn.state_dict(), policy_version=0, algo="dqn"))
    other = make_dqn()
    other.load_state_dict(decode_checkpoint(data, "checkpoint").model)
    assert other.train_iter == 3
    a, b = dqn.update(fixed_batch(seed=1)), other.update(fixed_batch(seed=1))
    assert a.loss == pytest.approx(b.loss)


def test_nstep_builder_returns_discounts_and_episode_ends():
    gamma = 0.5
    builder = NStepBuilder(num_envs=1, nstep=2, gamma=gamma)
    obs = [np.array([[float(t)]]) for t in range(5)]
    no = np.array([False])
    builder.add(obs[0], np.array([0]), np.array([1.0]), obs[1], no, no)
    assert len(builder) == 0  # waits for 2 steps
    builder.add(obs[1], np.array([1]), np.array([2.0]), obs[2], no, no)
    builder.add(obs[2], np.array([0]), np.array([4.0]), obs[3], np.array([True]), no)
    rows = builder.take()
    # (0 -> 2): 1 + 0.5*2; then at termination (1 -> 3): 2 + 0.5*4 and (2 -> 3): 4
    np.testing.assert_allclose(rows["reward"], [2.0, 4.0, 4.0])
    np.testing.assert_allclose(rows["obs"][:, 0], [0, 1, 2])
    np.testing.assert_allclose(rows["next_obs"][:, 0], [2, 3, 3])
    np.testing.assert_allclose(rows["done"], [0, 1, 1])
    np.testing.assert_allclose(rows["discount"], [0.25, 0.25, 0.5])
    assert len(builder) == 0


def test_truncation_bootstraps():
    builder = NStepBuilder(num_envs=2, nstep=3, gamma=0.9)
    obs, nxt = np.zeros((2, 1)), np.ones((2, 1))
    builder.add(
        obs,
        np.array([0, 1]),
        np.array([1.0, 1.0]),
        nxt,
        np.array([False, True]),
        np.array([True, False]),
    )
    rows = builder.take()
    np.testing.assert_allclose(rows["done"], [0.0, 1.0])  # truncated is not done
    np.testing.assert_allclose(rows["discount"], [0.9, 0.9])


def test_epsilon_schedules():
    from algorithms.dqn.config import EpsConfig

    exp = EpsilonSchedule(EpsConfig(type="exp", start=1.0, end=0.1, decay=100))
    assert exp(0) == pytest.approx(1.0)
    assert exp(100) == pytest.approx(0.1 + 0.9 * np.exp(-1))
    lin = EpsilonSchedule(EpsConfig(type="linear", start=1.0, end=0.1, decay=100))
    assert lin(50) == pytest.approx(0.55)
    assert lin(1000) == pytest.approx(0.1)
