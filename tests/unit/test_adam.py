"""FusedAdam against torch.optim.Adam(fused=True): the same steps and the same state."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from algorithms.adam import FusedAdam
from common.checkpoint_file import Checkpoint, decode_checkpoint, encode_checkpoint


def twin_networks() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    twin = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    twin.load_state_dict(net.state_dict())
    return net, twin


def train(net: torch.nn.Module, optimizer, steps: range, skip: set[int] = frozenset()) -> None:
    for i in steps:
        generator = torch.Generator().manual_seed(i)
        x = torch.randn(32, 4, generator=generator)
        optimizer.zero_grad(set_to_none=True)
        net(x).pow(2).mean().backward()
        optimizer.found_inf = torch.tensor(1.0 if i in skip else 0.0)
        optimizer.step()
        del optimizer.found_inf


def assert_same_state(ours: dict, theirs: dict) -> None:
    assert ours["param_groups"] == theirs["param_groups"]
    assert ours["state"].keys() == theirs["state"].keys()
    for index, values in theirs["state"].items():
        assert values.keys() == ours["state"][index].keys()
        for key, tensor in values.items():
            assert ours["state"][index][key].dtype == tensor.dtype, key
            assert torch.equal(ours["state"][index][key], tensor), key


@pytest.mark.parametrize("eps", [1e-8, 1e-5])
def test_steps_and_state_are_torchs_fused_adams(eps):
    net, twin = twin_networks()
    ours = FusedAdam(net.parameters(), lr=0.01, eps=eps)
    theirs = torch.optim.Adam(twin.parameters(), lr=0.01, eps=eps, fused=True)
    train(net, ours, range(20), skip={3, 11})
    train(twin, theirs, range(20), skip={3, 11})
    for a, b in zip(net.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)
    assert_same_state(ours.state_dict(), theirs.state_dict())
    assert float(ours.state_dict()["state"][0]["step"]) == 18  # the two skipped ones left out


def test_a_skipped_step_changes_nothing():
    net, _ = twin_networks()
    ours = FusedAdam(net.parameters(), lr=0.01)
    train(net, ours, range(3))
    before = [p.clone() for p in net.parameters()]
    moments = {k: v.clone() for k, v in ours.state_dict()["state"][0].items()}
    train(net, ours, range(3, 4), skip={3})
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    assert all(torch.equal(ours.state_dict()["state"][0][k], v) for k, v in moments.items())


def test_state_loads_both_ways_and_through_a_checkpoint_file():
    net, twin = twin_networks()
    ours = FusedAdam(net.parameters(), lr=0.01)
    theirs = torch.optim.Adam(twin.parameters(), lr=0.01, fused=True)
    train(net, ours, range(5))
    train(twin, theirs, range(5))
    # torch's state into ours, through a checkpoint file; ours into torch's
    stored = decode_checkpoint(
        encode_checkpoint(Checkpoint({"optimizer": theirs.state_dict()}, 1, "dqn")), "ckpt"
    ).model["optimizer"]
    resumed = FusedAdam(net.parameters(), lr=0.5)
    resumed.load_state_dict(stored)
    assert resumed.param_groups[0]["lr"] == 0.01
    assert_same_state(resumed.state_dict(), theirs.state_dict())
    back = torch.optim.Adam(twin.parameters(), lr=0.5, fused=True)
    back.load_state_dict(ours.state_dict())
    assert_same_state(ours.state_dict(), back.state_dict())
    # and they go on the same way
    train(net, resumed, range(5, 9))
    train(twin, theirs, range(5, 9))
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), twin.parameters(), strict=True))


def test_a_state_of_another_shape_is_refused():
    net, _ = twin_networks()
    ours = FusedAdam(net.parameters(), lr=0.01)
    other = FusedAdam([torch.nn.Parameter(torch.zeros(3))], lr=0.01)
    with pytest.raises(ValueError, match="parameters"):
        ours.load_state_dict(other.state_dict())
    with pytest.raises(ValueError, match="no parameters"):
        FusedAdam([], lr=0.01)


def test_training_with_it_never_imports_torchs_compiler():
    code = (
        "import sys, torch\n"
        "from algorithms.adam import FusedAdam\n"
        "net = torch.nn.Linear(4, 2)\n"
        "opt = FusedAdam(net.parameters(), lr=0.01)\n"
        "net(torch.randn(8, 4)).sum().backward()\n"
        "torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)\n"
        "opt.step(); opt.load_state_dict(opt.state_dict())\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False"
