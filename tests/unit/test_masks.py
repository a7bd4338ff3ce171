"""Legal-action masks through the algorithm seam: PPO acts only on allowed actions,
its loss puts no probability on masked ones, and the learner's segment check refuses
masks of the wrong width, rows that allow nothing and actions their mask forbade."""

import numpy as np
import pytest
import torch

from algorithms.registry import ALGORITHMS
from common.config import EnvConfig
from common.games import CONNECT_FOUR, TICTACTOE, GameVector
from common.storage import CorruptFileError
from jobconfig import fit_to_env, resolve_job_config
from services.learner.segments import SegmentSchema


def game_config(env_id):
    raw = {
        "env": {"adapter": "pettingzoo", "env_id": env_id},
        "policy": {"type": "ppo"},
        "system": {"workflow": "selfplay"},
    }
    config, _ = resolve_job_config(raw)
    return fit_to_env(config)


@pytest.mark.parametrize("env_id", [TICTACTOE, CONNECT_FOUR])
def test_no_illegal_action_in_ten_thousand_moves(env_id):
    torch.manual_seed(0)
    config = game_config(env_id)
    assert config.policy.model.action_mask
    actor = ALGORITHMS["ppo"].make_actor(config.policy)
    games = GameVector(EnvConfig(adapter="pettingzoo", env_id=env_id), 32)
    games.reset(seed=0)
    rng = np.random.default_rng(0)
    moves = 0
    try:
        while moves < 10_000:
            greedy = moves % 2 == 0
            if greedy:
                action = actor.greedy(games.obs, rng, games.mask)
            else:
                action, _, _ = actor.sample(games.obs, games.mask)
            legal = games.mask[np.arange(32), action]
            assert (legal == 1).all()
            games.step(action)  # raises on an illegal action too
            moves += 32
    finally:
        games.close()


def masked_round(config, rows=256, seed=0):
    rng = np.random.default_rng(seed)
    actions = config.policy.model.action_shape
    mask = (rng.random((rows, actions)) < 0.4).astype(np.float32)
    mask[np.arange(rows), rng.integers(0, actions, rows)] = 1
    action = np.array([rng.choice(np.flatnonzero(m)) for m in mask], dtype=np.int64)
    return {
        "obs": rng.normal(size=(rows, config.policy.model.obs_shape)).astype(np.float32),
        "action": action,
        "logp": np.full(rows, -1.0, np.float32),
        "adv": rng.normal(size=rows).astype(np.float32),
        "ret": rng.normal(size=rows).astype(np.float32),
        "action_mask": mask,
    }


def test_the_loss_never_puts_probability_on_a_masked_action():
    torch.manual_seed(0)
    config = game_config(CONNECT_FOUR)
    learner = ALGORITHMS["ppo"].make_learner(config.policy, "cpu")
    columns = masked_round(config)
    report = learner.train_round(columns, seed=0)
    assert np.isfinite(report.loss) and np.isfinite(report.entropy)
    obs = torch.as_tensor(columns["obs"])
    mask = torch.as_tensor(columns["action_mask"])
    dist = learner.model.distribution(obs, mask)
    assert (dist.probs[mask == 0] == 0).all()
    assert torch.allclose(dist.probs.sum(-1), torch.ones(len(obs)))
    # No gradient flows to a masked action's logit.
    logits = learner.model.actor(obs).detach().requires_grad_(True)
    masked = torch.distributions.Categorical(
        logits=logits.masked_fill(mask == 0, torch.finfo(logits.dtype).min)
    )
    loss = -(masked.log_prob(torch.as_tensor(columns["action"])) * 1.0).mean()
    loss.backward()
    assert (logits.grad[mask == 0] == 0).all()


def test_the_learner_refuses_bad_masks_naming_the_column():
    config = game_config(TICTACTOE)
    names = ALGORITHMS["ppo"].column_names_for(config.policy)
    assert "action_mask" in names
    schema = SegmentSchema.for_policy(config.policy, names)
    good = masked_round(config, rows=32)
    schema.check(good)
    wide = {**good, "action_mask": np.ones((32, 10), np.float32)}
    with pytest.raises(CorruptFileError, match="action_mask has shape"):
        schema.check(wide)
    empty = {**good, "action_mask": good["action_mask"].copy()}
    empty["action_mask"][3] = 0
    with pytest.raises(CorruptFileError, match="allow no action"):
        schema.check(empty)
    forbidden = {**good, "action_mask": good["action_mask"].copy()}
    forbidden["action_mask"][5, good["action"][5]] = 0
    forbidden["action_mask"][5, (good["action"][5] + 1) % 9] = 1
    with pytest.raises(CorruptFileError, match="masks"):
        schema.check(forbidden)
    # A job without masks never has the column.
    cartpole, _ = resolve_job_config({"policy": {"type": "ppo"}})
    assert "action_mask" not in ALGORITHMS["ppo"].column_names_for(fit_to_env(cartpole).policy)


def test_a_segment_with_bad_masks_is_skipped_and_listed(tmp_path):
    from common.storage import SharedStore
    from services.learner.segments import SegmentCache

    config = game_config(TICTACTOE)
    schema = SegmentSchema.for_policy(
        config.policy, ALGORITHMS["ppo"].column_names_for(config.policy)
    )
    store = SharedStore(tmp_path)
    good = masked_round(config, rows=16)
    segments = {
        "good": good,
        "wide": {**good, "action_mask": np.ones((16, 10), np.float32)},
        "empty": {**good, "action_mask": np.zeros((16, 9), np.float32)},
    }
    cache = SegmentCache(store, "job-1", schema)
    for seq, (what, columns) in enumerate(segments.items()):
        path = store.segment_path("job-1", "w", seq)
        store.write_segment(path, columns)
        got = cache.get(path)
        assert (got is None) == (what != "good"), what
    assert len(cache.unusable) == 2
