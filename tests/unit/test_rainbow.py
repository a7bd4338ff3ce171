"""C51 and Rainbow: the projection onto the support, the noisy layers, one update,
their config keys, and DI-engine's CartPole files for both."""

import numpy as np
import pytest
import torch

from algorithms.rainbow.actor import C51Policy, RainbowPolicy
from algorithms.rainbow.learner import DistributionalDQN, project
from algorithms.rainbow.networks import NoisyLinear, noisy_layers, with_noise
from common.config import ConfigError
from common.models import state_to_numpy
from jobconfig import load_config, resolve_job_config, with_spaces
from tests.algorithm_runs import fixed_batch
from tests.helpers import EXAMPLES


def policy_config(name, **policy):
    config, _ = resolve_job_config({"policy": {"type": name, **policy}})
    return with_spaces(config, 4, 2).policy


# --- the projection ---------------------------------------------------------------------


def test_the_projection_splits_each_moved_atom_between_its_neighbours():
    # Atoms -1, 0, 1 with mass 0.2, 0.5, 0.3; r + 0.5 z with r = 0.5 moves them to 0,
    # 0.5 and 1: the first lands on atom 0, the second halves between 0 and 1, the
    # third lands on atom 1.
    support = torch.tensor([-1.0, 0.0, 1.0])
    probs = torch.tensor([[0.2, 0.5, 0.3]])
    projected = project(probs, torch.tensor([0.5]), torch.tensor([0.5]), support)
    torch.testing.assert_close(projected, torch.tensor([[0.0, 0.45, 0.55]]))


@pytest.mark.parametrize(
    ("reward", "discount", "expected"),
    [
        (-0.25, 0.0, [0.25, 0.75, 0.0]),  # terminal: all at r, between atoms -1 and 0
        (3.0, 1.0, [0.0, 0.0, 1.0]),  # beyond v_max: clipped to it
        (-5.0, 0.9, [1.0, 0.0, 0.0]),  # below v_min: clipped to it
        (0.0, 1.0, [0.2, 0.5, 0.3]),  # r = 0, gamma = 1: unchanged
    ],
)
def test_the_projection_at_the_ends_and_on_terminal_steps(reward, discount, expected):
    support = torch.tensor([-1.0, 0.0, 1.0])
    probs = torch.tensor([[0.2, 0.5, 0.3]])
    projected = project(probs, torch.tensor([reward]), torch.tensor([discount]), support)
    torch.testing.assert_close(projected, torch.tensor([expected]))


def test_the_projection_keeps_each_rows_mass_and_mean_inside_the_support():
    torch.manual_seed(0)
    support = torch.linspace(-10, 10, 51)
    probs = torch.softmax(torch.randn(64, 51), dim=1)
    # |r| <= 1 and gamma <= 0.9 keep every moved atom within [-10, 10]
    reward, discount = torch.rand(64) * 2 - 1, torch.rand(64) * 0.9
    projected = project(probs, reward, discount, support)
    torch.testing.assert_close(projected.sum(dim=1), torch.ones(64))
    # Within the support, the projection keeps the mean: E[r + gamma Z].
    torch.testing.assert_close(
        (projected * support).sum(dim=1), reward + discount * (probs * support).sum(dim=1)
    )


# --- noisy layers -----------------------------------------------------------------------


def test_a_noisy_layer_draws_new_noise_on_reset_and_none_when_off():
    torch.manual_seed(0)
    layer = NoisyLinear(4, 3, sigma0=0.5)
    x = torch.randn(2, 4)
    first = layer(x)
    noise = (layer.eps_in.clone(), layer.eps_out.clone())
    layer.reset_noise()
    assert not torch.equal(layer.eps_in, noise[0]) and not torch.equal(layer.eps_out, noise[1])
    assert not torch.allclose(layer(x), first)
    with_noise(layer, False)
    mean = x @ layer.weight_mu.T + layer.bias_mu
    torch.testing.assert_close(layer(x), mean)
    layer.reset_noise()
    torch.testing.assert_close(layer(x), mean)
    # sigma starts at sigma0 / sqrt(fan_in); the noise is not part of the weights
    assert torch.all(layer.weight_sigma == 0.25)
    assert set(layer.state_dict()) == {"weight_mu", "weight_sigma", "bias_mu", "bias_sigma"}


def test_rainbow_collects_greedily_on_one_draw_of_noise_a_version_and_evaluates_without_it():
    torch.manual_seed(0)
    config = policy_config("rainbow", model={"sigma0": 2.0})
    actor = RainbowPolicy(config)
    assert not hasattr(actor, "epsilon")  # no epsilon: the noise explores
    weights = state_to_numpy(actor.network)
    obs = np.random.default_rng(1).normal(size=(256, 4)).astype(np.float32)
    rng = np.random.default_rng(0)
    actor.load(1, weights)
    first = actor.act(obs, rng, job_env_steps=10**9)
    noise = [layer.eps_in.clone() for layer in noisy_layers(actor.network)]
    with torch.no_grad():  # greedy on the noise it acted with
        noisy_q = actor.network(torch.as_tensor(obs))
    np.testing.assert_array_equal(first, noisy_q.argmax(dim=1).numpy())
    # the same version acts on the same draw; each new version on a new one
    np.testing.assert_array_equal(actor.act(obs, rng, job_env_steps=10**9), first)
    later = []
    for version in (2, 3, 4):
        actor.load(version, weights)
        later.append(actor.act(obs, rng, job_env_steps=10**9))
    drawn = [layer.eps_in for layer in noisy_layers(actor.network)]
    assert all(not torch.equal(a, b) for a, b in zip(noise, drawn, strict=True))
    assert any(not np.array_equal(first, actions) for actions in later)
    # evaluation: greedy on the noise-free (mean) network, the same every time
    greedy = actor.greedy(obs, rng)
    np.testing.assert_array_equal(greedy, actor.greedy(obs, rng))
    with torch.no_grad():
        with_noise(actor.network, False)
        mean_q = actor.network(torch.as_tensor(obs))
    np.testing.assert_array_equal(greedy, mean_q.argmax(dim=1).numpy())
    assert actor.exploration(0) == {"noise_sigma": pytest.approx(2.0 / 8, abs=1e-4)}


def test_c51_collects_epsilon_greedily():
    config = policy_config("c51", other={"eps": {"start": 1.0, "end": 0.0, "decay": 100}})
    actor = C51Policy(config)
    actor.load(1, state_to_numpy(actor.network))
    obs = np.random.default_rng(1).normal(size=(256, 4)).astype(np.float32)
    rng = np.random.default_rng(0)
    greedy = actor.greedy(obs, rng)
    np.testing.assert_array_equal(actor.act(obs, rng, job_env_steps=10**6), greedy)
    assert actor.exploration(0) == {"epsilon": 1.0}


# --- one update -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["c51", "rainbow"])
def test_one_update_moves_parameters_and_gives_finite_priorities(name):
    torch.manual_seed(0)
    learner = DistributionalDQN(
        policy_config(name, learn={"learning_rate": 1e-2}), noisy=name == "rainbow"
    )
    before = [p.detach().clone() for p in learner.online.parameters()]
    batch = fixed_batch()
    info = learner.update(batch)
    assert np.isfinite(info.loss) and learner.train_iter == 1
    assert info.td_abs.shape == (32,) and np.all(np.isfinite(info.td_abs))
    assert np.all(info.td_abs >= 0) and info.td_abs.max() > 0
    moved = [
        not torch.equal(a, b) for a, b in zip(before, learner.online.parameters(), strict=True)
    ]
    assert all(moved)  # every layer, the noisy ones' sigmas too
    if name == "c51":  # no noise: the loss on one batch falls
        for _ in range(30):
            last = learner.update(batch)
        assert last.loss < info.loss


def test_the_priorities_are_the_kl_divergence_to_the_projected_target():
    torch.manual_seed(0)
    learner = DistributionalDQN(policy_config("c51"), noisy=False)
    batch = fixed_batch(n=8)
    rows = torch.arange(8)
    with torch.no_grad():
        p = learner.online.log_probs(batch.obs)[rows, batch.action].exp()
        next_action = learner.online(batch.next_obs).argmax(dim=1)
        next_p = learner.target.log_probs(batch.next_obs)[rows, next_action].exp()
        target = project(
            next_p, batch.reward, batch.discount * (1 - batch.done), learner.online.support
        )
    kl = (target * (torch.log(target.clamp(min=1e-30)) - torch.log(p))).sum(dim=1)
    np.testing.assert_allclose(learner.update(batch).td_abs, kl.numpy(), rtol=1e-4, atol=1e-6)


# --- config -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ({"n_atom": 1}, "policy.model.n_atom"),
        ({"n_atom": 5000}, "policy.model.n_atom"),
        ({"v_min": 5, "v_max": 5}, "policy.model.v_max"),
        ({"v_min": 1, "v_max": -1}, "policy.model.v_max"),
        ({"v_max": float("nan")}, "policy.model.v_max"),
        ({"v_min": -1e9}, "policy.model.v_min"),
        ({"sigma0": 0}, "policy.model.sigma0"),
    ],
)
def test_the_support_and_noise_keys_are_bounded(model, field):
    with pytest.raises(ConfigError) as err:
        resolve_job_config({"policy": {"type": "rainbow", "model": model}})
    assert err.value.field == field


def test_each_algorithm_names_the_keys_it_ignores():
    _, warnings = resolve_job_config({"policy": {"type": "dqn", "model": {"n_atom": 11}}})
    assert warnings == ["policy.model.n_atom: ignored, dqn does not use it (c51 and rainbow do)"]
    _, warnings = resolve_job_config({"policy": {"type": "c51", "model": {"sigma0": 0.1}}})
    assert warnings == ["policy.model.sigma0: ignored, c51 does not use it (rainbow does)"]
    _, warnings = resolve_job_config({"policy": {"type": "rainbow", "other": {"eps": {"end": 0}}}})
    assert warnings == ["policy.other.eps.end: ignored, rainbow does not use it (c51 and dqn do)"]


def test_rainbow_defaults_to_n_step_returns_and_prioritized_replay():
    config, _ = resolve_job_config({"policy": {"type": "rainbow"}})
    assert config.policy.nstep == 3 and config.policy.other.replay_buffer.type == "prioritized"
    config, _ = resolve_job_config({"policy": {"type": "c51"}})
    assert config.policy.nstep == 1 and config.policy.other.replay_buffer.type == "uniform"


# --- DI-engine's CartPole files ---------------------------------------------------------


@pytest.mark.parametrize("name", ["rainbow", "c51"])
def test_di_engines_cartpole_file_resolves(name):
    raw, notes = load_config(EXAMPLES / "di_engine" / f"cartpole_{name}_config.py")
    config, warnings = resolve_job_config(raw)
    assert f"create_config.policy.type {name} -> policy.type {name}" in notes
    assert (config.policy.type, config.env.env_id, config.env.stop_value) == (
        name,
        "CartPole-v0",
        195,
    )
    model = config.policy.model
    assert (model.v_min, model.v_max, model.n_atom) == (-10, 10, 51)
    assert config.policy.nstep == 3 and config.policy.discount_factor == 0.97
    buffer = config.policy.other.replay_buffer
    assert buffer.type == "prioritized" and buffer.samples_per_insert == 2.4
    ignored = {w.split(":")[0] for w in warnings}
    expected = {"policy.collect.unroll_len"}
    if name == "rainbow":  # DI-engine's file keeps an epsilon; drover's rainbow has none
        expected |= {f"policy.other.eps.{key}" for key in ("type", "start", "end", "decay")}
    assert ignored == expected
