"""Learner checkpoints as one safetensors file each: tensors and JSON, no pickle.

A learner's `state_dict()` is a tree of dicts, lists and tuples whose leaves are
tensors (weights, optimizer moments, Adam's step counts) and plain values
(hyper-parameters such as the learning rate and betas, `train_iter`). The file holds:

- every tensor under the name of its place in the tree (`model/online/net.0.weight`,
  `model/optimizer/state/0/exp_avg`), as safetensors stores tensors;
- the rest of the tree as JSON in the file's metadata (key `drover`), where a tensor
  is `{"tensor": name}`, a tuple `{"tuple": [...]}` and a mapping
  `{"dict": [[key, value], ...]}` (pairs, so an optimizer's integer keys stay
  integers and the order is kept), with the algorithm that wrote the file and the
  policy version the learner had published.

Reading gives back the same tree: the same containers (an `OrderedDict` with the
`_metadata` a module's `load_state_dict` reads its layers' versions from), keys,
order and plain values, and tensors of the same dtype, shape and values, on the
device asked for. The file is written like every file of the store (one atomic
rename), so a reader sees a whole checkpoint or none.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from common.storage import CorruptFileError, SharedStore, check_algorithm

#: The version of the layout below; a file of another is refused.
FORMAT = 1
#: The metadata key the JSON part is stored under.
_KEY = "drover"


@dataclass(frozen=True)
class Checkpoint:
    #: The learner's `state_dict()`.
    model: dict[str, Any]
    #: The policy version the learner had published when it wrote the checkpoint.
    policy_version: int
    #: The algorithm (`policy.type`) whose learner wrote it.
    algo: str


def write_checkpoint(
    store: SharedStore, job_id: str, train_iter: int, checkpoint: Checkpoint, *, epoch: int = 0
) -> tuple[str, int]:
    """Write the job's checkpoint at `train_iter` by the learner of lease `epoch` (its
    name says both: common/storage.py); returns (path, size in bytes).

    Raises:
        TypeError: the state holds a value JSON and safetensors cannot represent.
    """
    data = encode_checkpoint(checkpoint)
    path = store.checkpoint_path(job_id, train_iter, epoch)
    store.write_bytes(path, data)
    return path, len(data)


def read_checkpoint(
    store: SharedStore, rel: str, *, algo: str, device: torch.device | str = "cpu"
) -> Checkpoint:
    """Read a checkpoint written for a job of algorithm `algo`, its tensors on `device`.

    Raises:
        OSError: it cannot be read.
        CorruptFileError: not a whole checkpoint of this format.
        WrongAlgorithm: written by another algorithm than `algo`.
    """
    checkpoint = decode_checkpoint(store.read_bytes(rel), rel, device)
    check_algorithm(rel, checkpoint.algo, algo)
    return checkpoint


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    tensors: dict[str, torch.Tensor] = {}
    record = {
        "format": FORMAT,
        "algo": checkpoint.algo,
        "policy_version": checkpoint.policy_version,
        "model": _encode(checkpoint.model, "model", tensors),
    }
    return st_save(tensors, metadata={_KEY: json.dumps(record)})


def decode_checkpoint(data: bytes, rel: str, device: torch.device | str = "cpu") -> Checkpoint:
    """The checkpoint in `data` (read from `rel`, which errors name).

    Raises:
        CorruptFileError: not a whole checkpoint of this format.
    """
    try:
        tensors = st_load(data)  # checks the header and every tensor's byte range
        header_len = int.from_bytes(data[:8], "little")
        record = json.loads(json.loads(data[8 : 8 + header_len])["__metadata__"][_KEY])
        if record["format"] != FORMAT:
            raise ValueError(f"format {record['format']!r}, not {FORMAT}")
        return Checkpoint(
            model=_decode(record["model"], tensors, torch.device(device)),
            policy_version=int(record["policy_version"]),
            algo=str(record["algo"]),
        )
    except (
        SafetensorError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        RecursionError,
    ) as exc:
        raise CorruptFileError(f"{rel}: not a valid checkpoint ({exc!r})") from None


_PLAIN = (bool, int, float, str, type(None))


def _encode(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    """`value` as JSON, its tensors moved into `tensors` under names from `path`."""
    if isinstance(value, torch.Tensor):
        # Names are unique even where a key holds a "/".
        name = path if path not in tensors else f"{path}#{len(tensors)}"
        # A contiguous CPU copy: safetensors refuses strided tensors and tensors that
        # share memory (a detached parameter would share the parameter's).
        tensors[name] = value.detach().to("cpu", memory_format=torch.contiguous_format, copy=True)
        return {"tensor": name}
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, _PLAIN):
                raise TypeError(f"{path}: a {type(key).__name__} key cannot be stored")
        items = [[k, _encode(v, f"{path}/{k}", tensors)] for k, v in value.items()]
        if not isinstance(value, OrderedDict):
            return {"dict": items}
        node: dict[str, Any] = {"ordered_dict": items}
        metadata = getattr(value, "_metadata", None)
        if metadata is not None:
            node["metadata"] = _encode(metadata, f"{path}/_metadata", tensors)
        return node
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, f"{path}/{i}", tensors) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{path}/{i}", tensors) for i, v in enumerate(value)]
    if isinstance(value, _PLAIN):
        return value
    raise TypeError(f"{path}: a {type(value).__name__} cannot be stored in a checkpoint")


def _decode(node: Any, tensors: dict[str, torch.Tensor], device: torch.device) -> Any:
    if isinstance(node, list):
        return [_decode(v, tensors, device) for v in node]
    if not isinstance(node, dict):
        return node
    if "tensor" in node:
        return tensors[node["tensor"]].to(device)
    if "tuple" in node:
        return tuple(_decode(v, tensors, device) for v in node["tuple"])
    if "dict" in node:
        return {k: _decode(v, tensors, device) for k, v in node["dict"]}
    if "ordered_dict" in node:
        ordered = OrderedDict((k, _decode(v, tensors, device)) for k, v in node["ordered_dict"])
        if "metadata" in node:
            ordered._metadata = _decode(node["metadata"], tensors, device)  # type: ignore[attr-defined]
        return ordered
    raise ValueError(f"unknown node {sorted(node)[:4]}")
