"""The learner's side of a population step (services/coordinator/population.py): the
next learner resumes the copied checkpoint, not the member's own newer versions, and
trains at the member's learning rate, not the donor's (the coordinator's side:
tests/service/test_population.py); and the `pbt:` section's own checks."""

import pytest
import torch

from algorithms.dqn.learner import DQN
from common.checkpoint_file import Checkpoint, write_checkpoint
from common.config import ConfigError
from common.storage import SharedStore
from jobconfig import resolve_job_config, with_spaces
from jobconfig.population import perturbed
from jobconfig.sweep import plan_sweep
from services.learner.resume import resume
from tests.learner_sessions import JOB, Coordinator, context, session


def dqn(learning_rate: float) -> DQN:
    config, _ = resolve_job_config({"policy": {"learn": {"learning_rate": learning_rate}}})
    return DQN(with_spaces(config, 4, 2).policy)


def trained(learning_rate: float, steps: int = 3) -> DQN:
    learner = dqn(learning_rate)
    for _ in range(steps):
        learner.optimizer.zero_grad()
        sum(p.sum() for p in learner.online.parameters()).backward()
        learner.optimizer.step()
    learner.train_iter = steps
    return learner


def test_a_checkpoint_brings_its_moments_not_its_learning_rate():
    donor = trained(0.01)
    member = dqn(0.002)
    member.load_state_dict(donor.state_dict())
    assert member.optimizer.param_groups[0]["lr"] == 0.002
    moments = [s["exp_avg"] for s in member.optimizer.state.values()]
    expected = [s["exp_avg"] for s in donor.optimizer.state.values()]
    assert len(moments) == len(expected) > 0
    assert all(torch.equal(a, b) for a, b in zip(moments, expected, strict=True))
    for a, b in zip(member.online.parameters(), donor.online.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_next_learner_resumes_the_copy_not_the_members_own_newer_version(tmp_path):
    store = SharedStore(tmp_path)
    coordinator = Coordinator(epoch=1)
    own = session(store, coordinator, epoch=1)
    own.learner.train_iter = 100
    own.checkpoint()
    own.learner.train_iter = 900
    own.publish()  # the member's own line, further in train iterations than the copy
    own.writes.close()
    donor = trained(0.01, steps=50)
    state = donor.state_dict()
    write_checkpoint(store, JOB, 50, Checkpoint(state, 7, "dqn"), epoch=2)  # the copy
    coordinator.epoch = 3
    learner = dqn(0.001)
    resumed = resume(store, JOB, "dqn", learner, context(coordinator, 3))
    assert resumed.checkpoint.endswith("learner-e00000002-0000000050.safetensors")
    assert resumed.policy is None and learner.train_iter == 50  # not version 1's 900
    assert resumed.version == 7  # the next publish goes past the copy's and its own
    for a, b in zip(learner.online.parameters(), donor.online.parameters(), strict=True):
        assert torch.equal(a, b)


def test_an_integer_stays_a_whole_number_of_at_least_one():
    assert perturbed(64, 1.25) == 80 and perturbed(1, 0.8) == 1
    assert perturbed(0.001, 0.8) == pytest.approx(0.0008)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            {"sweep": {"axes": {"policy.model.encoder_hidden_size_list": [[64], [128]]}}},
            "sweep.axes.policy.model.encoder_hidden_size_list",
        ),
        ({"sweep": {"seeds": 1}}, "pbt"),  # one job is no population
        ({"system": {"workflow": "evaluate"}}, "pbt"),
    ],
)
def test_a_population_refuses_what_it_cannot_train(change, field):
    config = {
        "sweep": {"seeds": 2},
        "pbt": {"params": ["policy.learn.learning_rate"]},
    }
    for key, value in change.items():
        config[key] = value
    with pytest.raises(ConfigError) as refused:
        plan_sweep(config)
    assert refused.value.field == field
