"""Learner checkpoints are safetensors with a JSON tree (no pickle): every algorithm's
state reads back exactly, a damaged file is refused, and so is one another algorithm
wrote."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

import pytest
import torch

from algorithms.registry import ALGORITHMS
from common.checkpoint_file import (
    Checkpoint,
    decode_checkpoint,
    encode_checkpoint,
    read_checkpoint,
    write_checkpoint,
)
from common.storage import CorruptFileError, SharedStore, WrongAlgorithm
from tests.algorithm_runs import CASES, job_config, synthetic_columns, train_once

JOB = "job-1"


def assert_same(a: Any, b: Any, path: str = "state") -> None:
    """The same tree: container types, keys in order, plain values, and tensors of the
    same dtype, shape and values (an OrderedDict's `_metadata` too)."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), path
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        assert getattr(a, "_metadata", None) == getattr(b, "_metadata", None), path
        for key in a:
            assert_same(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}/{i}")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


@pytest.mark.parametrize(("name", "space"), CASES)
def test_every_algorithms_checkpoint_reads_back_exactly(tmp_path, name, space):
    torch.manual_seed(0)
    algo = ALGORITHMS[name]
    config = job_config(name, space)
    learner = algo.make_learner(config.policy, "cpu")
    train_once(
        learner, synthetic_columns(config, algo.column_names_for(config.policy), 8), 8
    )  # optimizer state
    state = learner.state_dict()
    store = SharedStore(tmp_path)
    path, size = write_checkpoint(store, JOB, 7, Checkpoint(state, policy_version=3, algo=name))
    assert path == f"{JOB}/checkpoints/learner-e00000000-0000000007.safetensors"
    assert size == len(store.read_bytes(path))
    back = read_checkpoint(store, path, algo=name)
    assert (back.policy_version, back.algo) == (3, name)
    assert_same(state, back.model)
    resumed = algo.make_learner(config.policy, "cpu")
    resumed.load_state_dict(back.model)
    assert_same(state, resumed.state_dict())


def test_containers_keys_and_plain_values_read_back_as_they_were():
    module_state = OrderedDict(w=torch.arange(6, dtype=torch.bfloat16).reshape(2, 3))
    module_state._metadata = {"": {"version": 2}}  # type: ignore[attr-defined]
    state = {
        "online": module_state,
        # an optimizer's state: integer keys, a tuple, booleans, None and floats
        "optimizer": {
            "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2, 3)}},
            "param_groups": [
                {"lr": 1e-3, "betas": (0.9, 0.999), "fused": None, "amsgrad": False, "params": [0]}
            ],
        },
        "flags": torch.tensor([True, False]),
        "strided": torch.arange(12).reshape(3, 4).t(),  # not contiguous
        "train_iter": 12,
    }
    back = decode_checkpoint(
        encode_checkpoint(Checkpoint(state, policy_version=1, algo="dqn")), "x"
    )
    assert_same(state, back.model)


def test_a_value_neither_json_nor_a_tensor_is_refused_at_writing():
    with pytest.raises(TypeError, match="model/rng: a Generator cannot be stored"):
        encode_checkpoint(Checkpoint({"rng": torch.Generator()}, policy_version=0, algo="dqn"))


def test_a_damaged_checkpoint_is_refused(tmp_path):
    store = SharedStore(tmp_path)
    state = {"online": {"w": torch.ones(4)}, "train_iter": 1}
    path, _ = write_checkpoint(store, JOB, 1, Checkpoint(state, policy_version=1, algo="dqn"))
    data = store.read_bytes(path)
    store.write_bytes(path, data[:-3])  # truncated
    with pytest.raises(CorruptFileError, match="not a valid checkpoint"):
        read_checkpoint(store, path, algo="dqn")
    # a whole safetensors file of another kind: a policy version has no tree
    policy_path, _ = store.write_policy(JOB, 1, 0, "dqn", {"w": torch.ones(4).numpy()})
    with pytest.raises(CorruptFileError, match="not a valid checkpoint"):
        read_checkpoint(store, policy_path, algo="dqn")
    # a tree naming a tensor the file does not hold
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_len])
    record = json.loads(header["__metadata__"]["drover"])
    record["model"]["dict"][0][1]["dict"][0][1] = {"tensor": "model/elsewhere"}
    header["__metadata__"]["drover"] = json.dumps(record)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    store.write_bytes(path, len(raw).to_bytes(8, "little") + raw + data[8 + header_len :])
    with pytest.raises(CorruptFileError, match="model/elsewhere"):
        read_checkpoint(store, path, algo="dqn")


def test_a_checkpoint_or_policy_another_algorithm_wrote_is_refused_naming_both(tmp_path):
    store = SharedStore(tmp_path)
    state = {"online": {"w": torch.ones(4)}, "train_iter": 1}
    path, _ = write_checkpoint(store, JOB, 1, Checkpoint(state, policy_version=1, algo="ppo"))
    with pytest.raises(WrongAlgorithm) as refused:
        read_checkpoint(store, path, algo="dqn")
    assert str(refused.value) == (
        f"{path} was written by algorithm 'ppo', but this job's policy.type is 'dqn'"
    )
    policy_path, sha = store.write_policy(JOB, 1, 0, "sac", {"w": torch.ones(4).numpy()})
    with pytest.raises(WrongAlgorithm, match=f"{policy_path} was written by algorithm 'sac'"):
        store.read_policy(policy_path, sha256=sha, algo="dqn")
    assert store.read_policy(policy_path, sha256=sha, algo="sac").algo == "sac"
