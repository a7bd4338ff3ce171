"""The optimizer step that reads nothing from the device: the same step and norm as
`finite_step`, a non-finite loss skipped on the device, one read for what it reports.
`scaled_step` is the path an accelerator takes; torch's GradScaler runs it on the CPU
too, so it is tested here."""

import copy
import math

import numpy as np
import pytest
import torch

from algorithms.step import (
    adam,
    device_step,
    finite_step,
    scaled_step,
    to_device,
    to_host,
)


def model_and_loss(scale=1.0):
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    return layer, lambda: layer(torch.ones(4, 3)).pow(2).sum() * scale


@pytest.mark.parametrize("step", [device_step, scaled_step])
@pytest.mark.parametrize("max_grad_norm", [None, 0.01])
def test_the_same_step_and_norm_as_finite_step(step, max_grad_norm):
    layer, loss = model_and_loss()
    twin = copy.deepcopy(layer)
    optimizer, twin_optimizer = adam(layer.parameters(), 0.1), adam(twin.parameters(), 0.1)
    for _ in range(3):
        norm = step(loss(), optimizer, layer.parameters(), max_grad_norm)
        twin_loss = twin(torch.ones(4, 3)).pow(2).sum()
        expected = finite_step(twin_loss, twin_optimizer, twin.parameters(), max_grad_norm)
        assert float(norm) == pytest.approx(expected)
    for a, b in zip(layer.parameters(), twin.parameters(), strict=True):
        assert torch.allclose(a, b)


@pytest.mark.parametrize("step", [device_step, scaled_step])
def test_a_non_finite_loss_changes_no_weight_and_no_moment(step):
    layer, loss = model_and_loss()
    optimizer = adam(layer.parameters(), 0.1)
    step(loss(), optimizer, layer.parameters())  # moments exist
    weights = [p.clone() for p in layer.parameters()]
    moments = copy.deepcopy(optimizer.state_dict()["state"])
    norm = step(loss() * float("inf"), optimizer, layer.parameters(), 1.0)
    assert math.isnan(float(norm))
    assert all(torch.equal(a, b) for a, b in zip(weights, layer.parameters(), strict=True))
    for key, state in optimizer.state_dict()["state"].items():
        for name, value in state.items():
            assert torch.equal(value, moments[key][name]), name
    # The step count too: the skipped step did not count.
    assert int(optimizer.state_dict()["state"][0]["step"]) == 1
    assert not math.isnan(float(step(loss(), optimizer, layer.parameters())))
    assert int(optimizer.state_dict()["state"][0]["step"]) == 2


@pytest.mark.parametrize("step", [device_step, scaled_step])
@pytest.mark.parametrize("case", ["a NaN term no weight depends on", "an infinite norm"])
def test_a_non_finite_loss_or_norm_with_finite_gradients_skips_too(step, case):
    layer, loss = model_and_loss()
    optimizer = adam(layer.parameters(), 0.1)
    step(loss(), optimizer, layer.parameters())
    weights = [p.clone() for p in layer.parameters()]
    if case == "an infinite norm":
        # Finite gradients of about 1e37 each: their squares overflow the norm.
        bad = sum(p.sum() for p in layer.parameters()) * 1e37
    else:
        bad = loss() + torch.tensor(float("nan"))
    norm = step(bad, optimizer, layer.parameters(), 1.0)
    assert math.isnan(float(norm))
    assert all(torch.equal(a, b) for a, b in zip(weights, layer.parameters(), strict=True))
    assert int(optimizer.state_dict()["state"][0]["step"]) == 1


def test_an_optimizer_state_of_drovers_earlier_adam_loads_and_steps():
    """Checkpoints written before learners stepped torch.optim.Adam held the state of
    drover's own fused Adam, in torch's layout: it loads, and training goes on."""
    layer, loss = model_and_loss()
    shapes = [p.shape for p in layer.parameters()]
    earlier = {
        "state": {
            i: {
                "step": torch.tensor(7.0, dtype=torch.float32),
                "exp_avg": torch.full(shape, 0.01),
                "exp_avg_sq": torch.full(shape, 0.001),
            }
            for i, shape in enumerate(shapes)
        },
        "param_groups": [
            {
                "lr": 0.05,
                "betas": (0.9, 0.999),
                "eps": 1e-8,
                "weight_decay": 0,
                "amsgrad": False,
                "maximize": False,
                "foreach": None,
                "capturable": False,
                "differentiable": False,
                "fused": True,
                "decoupled_weight_decay": False,
                "params": list(range(len(shapes))),
            }
        ],
    }
    optimizer = adam(layer.parameters(), 0.1)
    optimizer.load_state_dict(earlier)
    assert optimizer.param_groups[0]["lr"] == 0.05
    assert float(device_step(loss(), optimizer, layer.parameters())) > 0
    assert int(optimizer.state_dict()["state"][0]["step"]) == 8


def test_learners_use_torchs_fused_adam_where_the_device_has_it():
    layer, _ = model_and_loss()
    optimizer = adam(layer.parameters(), 0.1, eps=1e-5)
    assert type(optimizer) is torch.optim.Adam
    assert optimizer.defaults["fused"] is True and optimizer.defaults["eps"] == 1e-5


def test_an_optimizer_that_cannot_skip_on_the_device_steps_as_finite_step_does():
    layer, loss = model_and_loss()
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    weights = [p.clone() for p in layer.parameters()]
    assert math.isnan(float(device_step(loss() * float("nan"), optimizer, layer.parameters())))
    assert all(torch.equal(a, b) for a, b in zip(weights, layer.parameters(), strict=True))
    assert float(device_step(loss(), optimizer, layer.parameters())) > 0


def test_to_host_reads_scalars_and_a_vector():
    values = {"a": torch.tensor(1.5), "b": torch.tensor(2)}
    scalars, vector = to_host(values, torch.arange(3, dtype=torch.float32))
    assert scalars == {"a": 1.5, "b": 2.0} and vector.tolist() == [0.0, 1.0, 2.0]


def test_to_device_keeps_values_and_dtypes_on_the_cpu():
    array = np.arange(6, dtype=np.int64).reshape(2, 3)
    tensor = to_device(array, torch.device("cpu"))
    assert tensor.dtype == torch.int64 and tensor.tolist() == array.tolist()
