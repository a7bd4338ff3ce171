"""R2D2: value rescaling, burn-in, padding, n-step targets within a sequence,
priorities, the actor's per-env state and epsilons, checkpoints, and learning a task
that needs memory."""

from __future__ import annotations

import copy
import dataclasses
import io
from typing import Any

import numpy as np
import pytest
import torch

from algorithms.r2d2.actor import R2D2Policy, apex_epsilons
from algorithms.r2d2.config import R2D2Config
from algorithms.r2d2.learner import (
    R2D2,
    UNLEARNED_PRIORITY,
    SequenceBatch,
    inverse_value_rescale,
    value_rescale,
)
from common.config import ConfigError, deep_merge
from common.models import state_to_numpy
from jobconfig import resolve_job_config, with_spaces

HIDDEN = 16


@pytest.fixture(autouse=True)
def one_thread():
    """These networks are tiny and run a step at a time, where torch's threads only
    contend (tens of times slower on a busy two-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def r2d2_config(obs: int = 4, actions: int = 2, **policy: Any) -> R2D2Config:
    """A small R2D2 policy config; `burnin_step` and `unroll_len` set the buffer's
    sequence length to match."""
    burnin = policy.get("burnin_step", 2)
    unroll = policy.get("unroll_len", 6)
    small = {
        "type": "r2d2",
        "burnin_step": burnin,
        "unroll_len": unroll,
        "nstep": 2,
        "model": {"encoder_hidden_size_list": [16], "lstm_hidden_size": HIDDEN},
        "other": {"replay_buffer": {"sequence_length": burnin + unroll, "overlap": burnin + 2}},
    }
    config, warnings = resolve_job_config({"policy": deep_merge(small, policy)})
    assert warnings == []
    resolved = with_spaces(config, obs, actions).policy
    assert isinstance(resolved, R2D2Config)
    return resolved


def sequences(
    batch: int, steps: int, lengths: list[int] | None = None, seed: int = 0, obs: int = 4
) -> dict[str, np.ndarray]:
    """Random sequence columns as the learner gets them, rows past each length zero."""
    rng = np.random.default_rng(seed)
    lengths = lengths or [steps] * batch
    valid = (np.arange(steps)[None, :] < np.array(lengths)[:, None]).astype(np.float32)
    columns = {
        "obs": rng.normal(size=(batch, steps, obs)).astype(np.float32),
        "action": rng.integers(0, 2, (batch, steps)),
        "reward": rng.normal(size=(batch, steps)).astype(np.float32),
        "done": np.zeros((batch, steps), np.float32),
        "h": rng.normal(size=(batch, steps, HIDDEN)).astype(np.float32),
        "c": rng.normal(size=(batch, steps, HIDDEN)).astype(np.float32),
    }
    for name, column in columns.items():
        mask = valid.reshape(*valid.shape, *([1] * (column.ndim - 2)))
        columns[name] = (column * mask).astype(column.dtype)
    columns["valid"] = valid
    return columns


def learner_pair(config: R2D2Config, other: R2D2Config) -> tuple[R2D2, R2D2]:
    """Two learners with the same weights, of two configs."""
    torch.manual_seed(0)
    first, second = R2D2(config), R2D2(other)
    second.load_state_dict(first.state_dict())
    return first, second


def test_value_rescaling_and_its_inverse_undo_each_other():
    x = torch.cat([torch.linspace(-1e4, 1e4, 2001), torch.linspace(-2, 2, 401)]).double()
    torch.testing.assert_close(inverse_value_rescale(value_rescale(x)), x, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(value_rescale(inverse_value_rescale(x)), x, rtol=1e-9, atol=1e-9)
    assert value_rescale(torch.tensor(3.0)).item() == pytest.approx(1.0 + 3e-3)


def test_burn_in_steps_get_no_gradient_and_no_loss():
    config = r2d2_config(burnin_step=3, unroll_len=5)
    learner = R2D2(config)
    columns = sequences(4, 8)
    batch = SequenceBatch.from_numpy(columns, np.ones(4, np.float32), torch.device("cpu"))
    obs = batch.obs.clone().requires_grad_(True)
    h0 = batch.h0.clone().requires_grad_(True)
    before = copy.deepcopy(learner)
    first = learner.update(dataclasses.replace(batch, obs=obs, h0=h0))
    assert obs.grad is not None and h0.grad is None  # the stored state only starts burn-in
    assert torch.all(obs.grad[:, :3] == 0) and torch.any(obs.grad[:, 3:] != 0)
    # The burn-in rows' actions and rewards are no step's target nor loss.
    changed = copy.deepcopy(columns)
    changed["action"][:, :3] = 1 - changed["action"][:, :3]
    changed["reward"][:, :3] += 100.0
    second = before.learn_batch(changed, np.ones(4, np.float32))
    assert second.loss == pytest.approx(first.loss, rel=1e-6)
    np.testing.assert_allclose(second.td_abs, first.td_abs, rtol=1e-6)


def test_a_sequence_that_starts_its_episode_is_learned_from_its_first_row():
    """Zeros, the stored state at an episode's start, are its exact state: no burn-in.
    Such sequences learn as with no burn-in at all; the others of the batch as before."""
    with_burnin = r2d2_config(burnin_step=3, unroll_len=5)
    without = r2d2_config(burnin_step=0, unroll_len=8)
    a, b = learner_pair(with_burnin, without)
    columns = sequences(4, 8, lengths=[8, 8, 5, 2])
    columns["done"][3, 1] = 1.0  # an episode of 2 steps: both within the burn-in
    for name in ("h", "c"):
        columns[name][:, 0] = 0.0  # each starts its episode
    weights = np.ones(4, np.float32)
    first, second = a.learn_batch(columns, weights), b.learn_batch(columns, weights)
    assert first.loss == pytest.approx(second.loss, rel=1e-6)
    np.testing.assert_allclose(first.td_abs, second.td_abs, rtol=1e-6)
    assert (first.td_abs > UNLEARNED_PRIORITY).all()  # the 2-row one too

    # In a batch with sequences that do not start their episode, each is learned as alone.
    learner = R2D2(with_burnin)
    mixed = sequences(4, 8, seed=3)
    for name in ("h", "c"):
        mixed[name][:2, 0] = 0.0
    batch = SequenceBatch.from_numpy(mixed, weights, torch.device("cpu"))
    assert batch.starts_episode.tolist() == [True, True, False, False]
    obs = batch.obs.clone().requires_grad_(True)
    before = copy.deepcopy(learner)
    together = learner.update(dataclasses.replace(batch, obs=obs)).td_abs
    assert obs.grad is not None
    assert torch.all(obs.grad[:2, :3].abs().sum(dim=2) > 0)  # learned from row 0
    assert torch.all(obs.grad[2:, :3] == 0)  # burn-in only
    for rows in ([0, 1], [2, 3]):
        alone = copy.deepcopy(before).learn_batch(
            {k: v[rows] for k, v in mixed.items()}, weights[rows]
        )
        np.testing.assert_allclose(together[rows], alone.td_abs, rtol=1e-5)


def test_padding_rows_change_nothing():
    """The buffer pads short sequences (repeating their last row): whatever the
    padding holds, the loss, the priorities and the step taken are the same."""
    config = r2d2_config()
    zeros, garbage = learner_pair(config, config)
    columns = sequences(3, 8, lengths=[8, 5, 3])
    noisy = copy.deepcopy(columns)
    rng = np.random.default_rng(1)
    pad = columns["valid"] == 0
    noisy["obs"][pad] = rng.normal(size=(int(pad.sum()), 4)) * 1e3
    noisy["action"][pad] = 1
    noisy["reward"][pad] = 1e3
    noisy["done"][pad] = 1.0
    noisy["h"][pad] = 7.0
    weights = np.ones(3, np.float32)
    a, b = zeros.learn_batch(columns, weights), garbage.learn_batch(noisy, weights)
    assert a.loss == b.loss and a.scalars == b.scalars
    np.testing.assert_array_equal(a.td_abs, b.td_abs)
    for p, q in zip(zeros.online.parameters(), garbage.online.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_priorities_mix_max_and_mean_td_by_eta():
    columns = sequences(5, 8, lengths=[8, 8, 6, 5, 2])
    columns["done"][3, 4] = 1.0  # the fourth's episode terminates at its last row
    weights = np.ones(5, np.float32)
    reports = {}
    for eta in (0.0, 0.9, 1.0):
        learner, _ = learner_pair(r2d2_config(learn={"priority_eta": eta}), r2d2_config())
        reports[eta] = learner.learn_batch(columns, weights).td_abs
    assert all(td.shape == (5,) for td in reports.values())
    mean, mixed, top = reports[0.0], reports[0.9], reports[1.0]
    np.testing.assert_allclose(mixed, 0.9 * top + 0.1 * mean, rtol=1e-5)
    assert np.all(top[:4] >= mean[:4])
    # 2 rows, both burn-in: nothing learned, a small priority
    assert top[4] == mean[4] == pytest.approx(UNLEARNED_PRIORITY)


def constant_q(learner: R2D2, q: tuple[float, float]) -> None:
    """Both networks give Q = q in every state: zero weights, and a dueling head's
    biases (value mean(q), advantages q - mean(q))."""
    with torch.no_grad():
        for network in (learner.online, learner.target):
            for p in network.parameters():
                p.zero_()
            mean = sum(q) / len(q)
            network.value.bias.fill_(mean)
            network.advantage.bias.copy_(torch.tensor([v - mean for v in q]))


def test_nstep_targets_of_a_hand_made_sequence_are_exact():
    """gamma 0.5, n 2, Q(., 0) = 1 and Q(., 1) = 3 everywhere (so every bootstrap is
    3), actions 0, no burn-in, no rescaling."""
    config = r2d2_config(
        burnin_step=0,
        unroll_len=5,
        discount_factor=0.5,
        learn={"value_rescale": False, "learning_rate": 1e-9},
    )
    learner = R2D2(config)
    constant_q(learner, (1.0, 3.0))
    columns = sequences(3, 5, lengths=[5, 3, 3])
    columns["action"][:] = 0
    columns["reward"][:] = [[1, 2, 4, 8, 16], [1, 2, 4, 0, 0], [1, 1, 1, 0, 0]]
    columns["done"][:] = [[0, 0, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0]]
    # a window inside an episode: steps 0..2 bootstrap at t+2, 3 and 4 reach past its
    # end (a later window learns them): targets 2 + 0.75, 4 + 0.75, 8 + 0.75
    inside = np.array([2.75, 4.75, 8.75]) - 1.0
    # its episode terminates at step 2: step 0 bootstraps, 1 and 2 only sum rewards
    terminated = np.array([2.75, 4.0, 4.0]) - 1.0
    # a time limit ended it after 3 steps: only step 0 has its row t+2
    truncated = np.array([2.25]) - 1.0
    weights = np.array([1.0, 2.0, 1.0], np.float32)
    report = learner.learn_batch(columns, weights)
    # each sequence's mean over its learned steps, weighted, then the batch's mean
    means = [(inside**2).mean(), 2.0 * (terminated**2).mean(), (truncated**2).mean()]
    assert report.loss == pytest.approx(sum(means) / 3, rel=1e-6)
    eta = config.learn.priority_eta
    expected = [eta * td.max() + (1 - eta) * td.mean() for td in (inside, terminated, truncated)]
    np.testing.assert_allclose(report.td_abs, expected, rtol=1e-6)


def test_epsilons_follow_apex_per_env():
    np.testing.assert_allclose(
        apex_epsilons(0.4, 7.0, 8), [0.4 ** (1 + 7.0 * i / 7) for i in range(8)]
    )
    assert apex_epsilons(0.4, 7.0, 1).tolist() == [0.4]
    config = r2d2_config(other={"eps": {"base": 0.5, "alpha": 7.0}})
    actor = R2D2Policy(config)
    learner = R2D2(config)
    constant_q(learner, (1.0, 3.0))  # greedy: action 1
    actor.load(1, state_to_numpy(learner.online))
    rng = np.random.default_rng(0)
    obs = np.zeros((2, 4), np.float32)
    actions = np.stack([actor.act(obs, rng, 0) for _ in range(4000)])
    assert actor.exploration(0) == {"epsilon_min": round(0.5**8, 4), "epsilon_max": 0.5}
    # a random action is the greedy one half the time
    off_greedy = (actions == 0).mean(axis=0)
    assert 0.2 < off_greedy[0] < 0.3 and off_greedy[1] < 0.01


def test_recorded_is_the_state_before_the_act():
    config = r2d2_config()
    actor = R2D2Policy(config)
    rng = np.random.default_rng(0)
    obs = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
    actor.act(obs, rng, 0)
    first = actor.recorded()
    assert first["h"].shape == first["c"].shape == (3, HIDDEN)
    assert first["h"].dtype == np.float32 and not first["h"].any() and not first["c"].any()
    actor.act(obs, rng, 0)
    with torch.no_grad():
        _, (h, c) = actor.network.step(torch.as_tensor(obs), actor.network.initial_state(3))
    np.testing.assert_allclose(actor.recorded()["h"], h.numpy(), rtol=1e-6)
    np.testing.assert_allclose(actor.recorded()["c"], c.numpy(), rtol=1e-6)
    actor.greedy(obs, rng)  # evaluation moves the state on too
    assert not np.allclose(actor.recorded()["h"], h.numpy())


def test_reset_state_zeroes_only_the_ended_envs():
    config = r2d2_config()
    kept, reset = R2D2Policy(config), R2D2Policy(config)
    reset.load(1, state_to_numpy(kept.network))
    obs = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
    for actor in (kept, reset):
        rng = np.random.default_rng(0)
        actor.act(obs, rng, 0)
        actor.act(obs, rng, 0)
    reset.reset_state(np.array([False, True, False]))
    for actor in (kept, reset):
        actor.act(obs, np.random.default_rng(0), 0)
    a, b = kept.recorded(), reset.recorded()
    for name in ("h", "c"):
        assert not b[name][1].any() and a[name][1].any()
        np.testing.assert_array_equal(a[name][[0, 2]], b[name][[0, 2]])
    reset.reset_state(np.array([0, 2]))  # indices do as well
    reset.act(obs, np.random.default_rng(0), 0)
    assert not reset.recorded()["h"][[0, 2]].any() and reset.recorded()["h"][1].any()


def test_state_dict_round_trips_through_a_weights_only_load():
    config = r2d2_config()
    learner = R2D2(config)
    columns = sequences(4, 8)
    weights = np.ones(4, np.float32)
    for _ in range(3):
        learner.learn_batch(columns, weights)
    buffer = io.BytesIO()
    torch.save(learner.state_dict(), buffer)
    buffer.seek(0)
    resumed = R2D2(config)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert resumed.train_iter == 3
    again = sequences(4, 8, seed=1)
    a, b = learner.learn_batch(again, weights), resumed.learn_batch(again, weights)
    assert a.loss == pytest.approx(b.loss) and np.allclose(a.td_abs, b.td_abs)


def test_config_checks_name_the_sequence_keys():
    assert r2d2_config().collect_nstep == 1
    config, _ = resolve_job_config({"policy": {"type": "r2d2"}})
    assert config.policy.other.replay_buffer.sequence_length == 20  # burn-in 2, unroll 18
    cases = [
        ({"other": {"replay_buffer": {"item": "episode", "overlap": 0}}}, "item"),
        ({"burnin_step": 4}, "sequence_length"),
        ({"burnin_step": 20}, "burnin_step"),
        ({"nstep": 18}, "nstep"),
    ]
    for policy, key in cases:
        with pytest.raises(ConfigError) as err:
            resolve_job_config({"policy": {"type": "r2d2", **policy}})
        assert err.value.field.endswith(key), err.value
    with pytest.raises(ConfigError, match="set it to 22"):
        resolve_job_config({"policy": {"type": "r2d2", "burnin_step": 4}})


def test_config_refuses_an_overlap_that_leaves_steps_unlearned():
    """A sequence learns neither its burn-in rows nor its last nstep rows: the next one
    must share at least burnin_step + nstep rows with it."""

    def policy(overlap: int) -> dict[str, Any]:
        buffer = {"sequence_length": 80, "overlap": overlap}
        return {
            "type": "r2d2",
            "burnin_step": 40,
            "unroll_len": 40,
            "nstep": 5,
            "other": {"replay_buffer": buffer},
        }

    for overlap in (40, 44):
        with pytest.raises(ConfigError, match="at least 45") as err:
            resolve_job_config({"policy": policy(overlap)})
        assert err.value.field == "policy.other.replay_buffer.overlap"
    config, _ = resolve_job_config({"policy": policy(45)})
    assert config.policy.other.replay_buffer.overlap == 45


# --- learning a task that needs memory ------------------------------------------------

DECISION_STEP = 4  # the bit is shown at step 0, the reward comes at this step


def memory_episodes(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Observations [count, steps, 2] of episodes whose bit (returned too) is shown at
    step 0 only; every later observation is the same whatever the bit."""
    bits = rng.integers(0, 2, count)
    obs = np.zeros((count, DECISION_STEP + 1, 2), np.float32)
    obs[:, 0, 0] = 2.0 * bits - 1.0
    obs[:, 0, 1] = 1.0
    return obs, bits


def test_learns_a_task_that_needs_memory():
    """Reward 1 at step 4 for the action equal to a bit seen at step 0 only; episodes
    of random actions, replayed as whole sequences from the zero state."""
    torch.manual_seed(0)
    config = r2d2_config(
        obs=2,
        burnin_step=0,
        unroll_len=8,
        discount_factor=0.9,
        learn={"learning_rate": 3e-3, "target_update_freq": 20},
    )
    learner = R2D2(config)
    rng = np.random.default_rng(0)
    batch, steps = 32, 8
    episode = DECISION_STEP + 1
    for _ in range(300):
        obs, bits = memory_episodes(rng, batch)
        actions = rng.integers(0, 2, (batch, episode))
        columns = sequences(batch, steps, lengths=[episode] * batch, obs=2)
        columns["obs"][:, :episode] = obs
        columns["action"][:, :episode] = actions
        columns["reward"][:] = 0.0
        columns["reward"][:, DECISION_STEP] = actions[:, DECISION_STEP] == bits
        columns["done"][:] = 0.0
        columns["done"][:, DECISION_STEP] = 1.0
        columns["h"][:] = 0.0  # each sequence is a whole episode: it starts from zeros
        columns["c"][:] = 0.0
        report = learner.learn_batch(columns, np.ones(batch, np.float32))
    assert learner.skipped_updates == 0 and np.isfinite(report.loss)

    actor = R2D2Policy(config)
    actor.load(1, state_to_numpy(learner.online))
    obs, bits = memory_episodes(np.random.default_rng(1), 200)
    assert np.array_equal(obs[0, DECISION_STEP], obs[1, DECISION_STEP])
    act_rng = np.random.default_rng(2)
    for t in range(episode):
        actions = actor.greedy(obs[:, t], act_rng)
    assert (actions == bits).mean() >= 0.95
