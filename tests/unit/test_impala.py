import numpy as np
import pytest
import torch

from algorithms.impala.learner import TRUNCATION_COLUMNS, Impala, vtrace
from algorithms.registry import ALGORITHMS
from common.storage import SharedStore
from jobconfig import resolve_job_config, with_spaces
from services.learner.segments import SegmentSchema
from tests.algorithm_runs import collect_one_segment, job_config, publish_fresh_policy


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


# Time-limit truncations: bootstrapped from V(final_obs), where a termination bootstraps 0.

GAMMA = 0.9
T = 6
#: One unroll of two envs. Env 0: an episode truncated after step 2, one terminated
#: after step 4, one still running at the unroll's end. Env 1: no episode ends.
TRUNCATED = np.array([[0, 0, 1, 0, 0, 0], [0] * T], np.float32)
DONE = np.array([[0, 0, 1, 0, 1, 0], [0] * T], np.float32)
#: The steps whose targets a truncation may change: its own episode's, up to its end
#: (V-trace carries each step's correction back through the episode).
TRUNCATED_EPISODE = np.array([[1, 1, 1, 0, 0, 0], [0] * T], bool)


def impala_with_values() -> Impala:
    """A learner whose critic gives values far from its small initial ones, so a
    bootstrap shows in the targets; its policy stays near uniform, so importance
    weights stay near 1 and corrections travel back."""
    torch.manual_seed(0)
    config, _ = resolve_job_config({"policy": {"type": "impala", "discount_factor": GAMMA}})
    impala = Impala(with_spaces(config, 4, 2).policy)
    with torch.no_grad():
        for p in impala.model.critic.parameters():
            p.add_(torch.randn_like(p))
    return impala


def unroll_columns(rng: np.random.Generator) -> dict[str, np.ndarray]:
    final_obs = rng.normal(size=(2, T, 4)).astype(np.float32)
    # What a terminated step ended on must not count: far from anything else.
    final_obs[0, 4] = 100.0
    return {
        "obs": rng.normal(size=(2, T, 4)).astype(np.float32),
        "action": rng.integers(0, 2, (2, T)).astype(np.int64),
        "reward": rng.uniform(0.0, 1.0, (2, T)).astype(np.float32),
        "logp": np.log(rng.uniform(0.2, 0.8, (2, T))).astype(np.float32),
        "done": DONE,
        "bootstrap_obs": rng.normal(size=(2, 4)).astype(np.float32),
        "truncated": TRUNCATED,
        "final_obs": final_obs,
    }


def without_truncations(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The columns as before truncations were recorded: every end a termination."""
    return {k: v for k, v in columns.items() if k not in TRUNCATION_COLUMNS}


def value(impala: Impala, obs: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return impala.model.value(torch.as_tensor(obs)).numpy()


def learner_logp(impala: Impala, columns: dict[str, np.ndarray]) -> np.ndarray:
    """The learner's log-probabilities of the recorded actions, [B, T]."""
    with torch.no_grad():
        dist = impala.model.distribution(torch.as_tensor(columns["obs"]))
        return impala.model.log_prob(dist, torch.as_tensor(columns["action"])).numpy()


def test_on_policy_targets_bootstrap_a_truncation_from_its_final_observation():
    """On-policy, V-trace's target is the discounted return to the episode's end or
    the unroll's, bootstrapped from V(final_obs) at a truncation, from 0 at a
    termination, and from V(bootstrap_obs) at the unroll's end."""
    impala = impala_with_values()
    columns = unroll_columns(np.random.default_rng(1))
    # behaviour = target policy: every importance weight is 1
    columns["logp"] = learner_logp(impala, columns)
    r = columns["reward"][0]
    v_final = value(impala, columns["final_obs"][0, 2])
    v_boot = value(impala, columns["bootstrap_obs"][0])
    expected = [
        r[0] + GAMMA * r[1] + GAMMA**2 * r[2] + GAMMA**3 * v_final,
        r[1] + GAMMA * r[2] + GAMMA**2 * v_final,
        r[2] + GAMMA * v_final,
        r[3] + GAMMA * r[4],  # terminated after step 4: nothing after it
        r[4],
        r[5] + GAMMA * v_boot,
    ]
    vs = impala.targets(columns).vs[0]
    torch.testing.assert_close(vs, torch.tensor(expected, dtype=torch.float32))


def test_a_truncation_changes_only_its_own_episodes_targets():
    impala = impala_with_values()
    columns = unroll_columns(np.random.default_rng(2))
    fixed = impala.targets(columns)
    before = impala.targets(without_truncations(columns))  # a truncation was an end
    for name in ("vs", "pg_advantages"):
        new, old = getattr(fixed, name).numpy(), getattr(before, name).numpy()
        assert (new != old).tolist() == TRUNCATED_EPISODE.tolist(), name
    # At the truncation step, the one-step target gains gamma * V(final_obs), weighted
    # by the clipped importance ratio like the rest of the step's TD error.
    rho = min(1.0, float(np.exp(learner_logp(impala, columns)[0, 2] - columns["logp"][0, 2])))
    gain = rho * GAMMA * value(impala, columns["final_obs"][0, 2])
    assert fixed.vs[0, 2].item() - before.vs[0, 2].item() == pytest.approx(gain, rel=1e-4)


def test_a_termination_still_bootstraps_zero():
    """A step that both terminated and hit the time limit is recorded as terminated
    (`truncated` 0): its final observation, however valued, changes nothing."""
    impala = impala_with_values()
    columns = unroll_columns(np.random.default_rng(3))
    columns["truncated"] = np.zeros_like(TRUNCATED)
    moved = {**columns, "final_obs": columns["final_obs"] + 50.0}
    targets = impala.targets(columns)
    for other in (impala.targets(moved), impala.targets(without_truncations(columns))):
        torch.testing.assert_close(targets.vs, other.vs, rtol=0, atol=0)
        torch.testing.assert_close(targets.pg_advantages, other.pg_advantages, rtol=0, atol=0)


def test_an_update_trains_on_truncation_columns():
    impala = impala_with_values()
    columns = unroll_columns(np.random.default_rng(4))
    info = impala.learn_batch(columns, np.ones(2, np.float32))
    assert np.isfinite(info.loss) and impala.skipped_updates == 0


@pytest.mark.timeout(60)
def test_the_unrolls_loop_records_time_limit_truncations(tmp_path, monkeypatch):
    """CartPole-v1 cut at 3 steps (no pole falls that soon): the collector marks each
    cut, with the observation the episode ended on, and the learner bootstraps the
    cut episodes from it and nothing else."""
    declared = ALGORITHMS["impala"]
    assert set(TRUNCATION_COLUMNS) <= set(declared.column_names) & set(declared.column_names)
    torch.manual_seed(0)
    store = SharedStore(tmp_path)
    config = job_config(
        "impala",
        "discrete",
        env={"env_kwargs": {"max_episode_steps": 3}},
        policy={"collect": {"unroll_len": 8}},
    )
    _, segment = collect_one_segment(store, config, publish_fresh_policy(store, config))
    assert sorted(segment) == sorted(declared.column_names)
    columns = SegmentSchema.for_policy(config.policy, declared.column_names).check(segment)
    # The first unroll of each env (a segment may hold the unrolls of several rounds).
    columns = {name: column[:2] for name, column in columns.items()}
    cuts = [[0, 0, 1, 0, 0, 1, 0, 0]] * 2  # both envs, episodes of 3 steps
    assert columns["truncated"].tolist() == cuts and columns["done"].tolist() == cuts
    final_obs, obs = columns["final_obs"], columns["obs"]
    # Where no episode ended, an episode goes on from the observation it ended on.
    np.testing.assert_array_equal(final_obs[:, [0, 1, 3, 4, 6]], obs[:, [1, 2, 4, 5, 7]])
    np.testing.assert_array_equal(final_obs[:, 7], columns["bootstrap_obs"])
    # At a cut, the next step is another episode's.
    assert not np.array_equal(final_obs[:, [2, 5]], obs[:, [3, 6]])

    impala = impala_with_values()
    fixed = impala.targets(columns)
    before = impala.targets(without_truncations(columns))
    changed = (fixed.vs != before.vs).numpy()
    assert changed[:, :6].all() and not changed[:, 6:].any()
