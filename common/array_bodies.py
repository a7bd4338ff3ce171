"""Binary bodies for the data plane's hot routes: a message's numeric lists as typed
arrays, and everything else as JSON, in one safetensors byte string.

A learner's round sends up to 65,536 priorities and gets back as many keys, rows and
weights. As JSON each number is printed, parsed and checked one at a time on both
sides; as an array it is one block of bytes, checked with one vectorized test. The
control plane stays JSON; these bodies are only for samples (request and reply) and
segment inserts, and a client asks for them (`Content-Type`, `Accept`), so every tool
that speaks JSON keeps working.

The frame (`CONTENT_TYPE`) is a safetensors file (https://github.com/huggingface/safetensors:
8 bytes of header length, little-endian; a JSON header; the arrays' bytes): every
tensor is 1-D, named after the field it carries, with the dtype the route's spec
names; the header's `__metadata__` has one entry, `message`, the message's other
fields as JSON, validated as the JSON body would be. Never pickle.

Usage::

    data = encode(request, SAMPLE_REQUEST_ARRAYS)             # a learner
    request = decode(SampleRequest, data, SAMPLE_REQUEST_ARRAYS)   # a buffer process
    data = items.frame()                                      # the buffer's reply
    reply = SampledItems.from_frame(data).reply()             # the learner again
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import numpy as np
from annotated_types import Ge, Gt, Le, MaxLen
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from common.messages import (
    MAX_BATCH_SIZE,
    MAX_KEYS_PER_UPDATE,
    MAX_PRIORITY,
    MAX_SAMPLE_ITEMS,
    MessageError,
    SampledBatch,
    SampledSegment,
    SampleReply,
    dump_json,
    message,
    parse,
)

#: The media type of a frame, in `Content-Type` (a body) and `Accept` (a reply).
CONTENT_TYPE = "application/vnd.drover.arrays"
_MESSAGE = "message"

T = TypeVar("T")


@dataclass(frozen=True)
class ArrayField:
    """One field carried as an array: its dtype, its most elements, and its bounds."""

    dtype: type[np.generic]
    max_len: int
    low: float | None = None
    high: float | None = None


#: A sample request's priorities (`SampleRequest.priority_keys`, `.priorities`).
SAMPLE_REQUEST_ARRAYS = {
    "priority_keys": ArrayField(np.int64, MAX_KEYS_PER_UPDATE, low=0),
    "priorities": ArrayField(np.float64, MAX_KEYS_PER_UPDATE, low=0, high=MAX_PRIORITY),
}
#: A priority update's (`PriorityUpdate.keys`, `.priorities`).
PRIORITY_UPDATE_ARRAYS = {
    "keys": ArrayField(np.int64, MAX_KEYS_PER_UPDATE, low=0),
    "priorities": ArrayField(np.float64, MAX_KEYS_PER_UPDATE, low=0, high=MAX_PRIORITY),
}


#: A sample reply's items (`SampledItems`), with `batch_size`, `paths` and `hold_id`
#: in its JSON.
SAMPLED_ARRAYS = {
    "keys": ArrayField(np.int64, MAX_SAMPLE_ITEMS, low=0),
    "weights": ArrayField(np.float64, MAX_SAMPLE_ITEMS),
    "segment": ArrayField(np.int32, MAX_SAMPLE_ITEMS, low=0),
    "rows": ArrayField(np.int64, MAX_SAMPLE_ITEMS, low=0),
    "lengths": ArrayField(np.int32, MAX_SAMPLE_ITEMS, low=0),
}


def describe(fields: dict[str, ArrayField]) -> str:
    """What a frame of these array fields holds, for the OpenAPI document."""
    arrays = "; ".join(
        f"{name}: {np.dtype(spec.dtype).name}, at most {spec.max_len}"
        for name, spec in fields.items()
    )
    return (
        "A safetensors byte string: 8 bytes of header length (little-endian), a JSON "
        "header, the arrays' bytes. 1-D arrays named after their fields (" + arrays + "); "
        "the header's __metadata__.message holds the other fields as JSON, as in the "
        "JSON form. Ask for it with Accept (a reply) or send it with Content-Type (a body)."
    )


def wants_arrays(accept: str | None) -> bool:
    """Whether an `Accept` header asks for a frame."""
    return bool(accept) and CONTENT_TYPE in accept  # type: ignore[operator]


def encode(msg: Any, fields: dict[str, ArrayField]) -> bytes:
    """`msg` as a frame: `fields` as arrays, the rest as JSON."""
    arrays = {
        name: np.asarray(getattr(msg, name), dtype=spec.dtype) for name, spec in fields.items()
    }
    rest = dataclasses.replace(msg, **{name: [] for name in fields})
    return frame(arrays, dump_json(rest).decode())


def decode(cls: type[T], data: bytes, fields: dict[str, ArrayField]) -> T:
    """The message of class `cls` in frame `data`, whose arrays are `fields`, each
    checked for its dtype, length and bounds as the JSON body's values would be.

    Raises:
        MessageError: naming the first offending field.
    """
    arrays, message = unframe(data, fields, cls.__name__)
    return dataclasses.replace(
        parse(cls, message), **{name: array.tolist() for name, array in arrays.items()}
    )


def frame(arrays: dict[str, np.ndarray], message: str) -> bytes:
    return st_save(
        {name: np.ascontiguousarray(a) for name, a in arrays.items()}, {_MESSAGE: message}
    )


def unframe(
    data: bytes, fields: dict[str, ArrayField], what: str
) -> tuple[dict[str, np.ndarray], str]:
    """The checked arrays of frame `data` (those of `fields` it carries) and its
    message's JSON text."""
    try:
        arrays = st_load(data)  # checks the header and every tensor's byte range
        header_len = int.from_bytes(data[:8], "little")
        message = json.loads(data[8 : 8 + header_len])["__metadata__"][_MESSAGE]
    except (SafetensorError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise MessageError("body", f"not a {what} frame ({exc})") from None
    if not isinstance(message, str):
        raise MessageError("body", f"not a {what} frame (its message is not JSON text)")
    for name, array in arrays.items():
        if name not in fields:
            raise MessageError(name, f"a {what} frame carries no array {name!r}")
        check_array(name, array, fields[name])
    return arrays, message


def check_array(name: str, array: np.ndarray, spec: ArrayField) -> np.ndarray:
    if array.dtype != spec.dtype:
        raise MessageError(name, f"must be {np.dtype(spec.dtype).name}, not {array.dtype.name}")
    if array.ndim != 1:
        raise MessageError(name, f"must be 1-D, not of shape {list(array.shape)}")
    if len(array) > spec.max_len:
        raise MessageError(name, f"holds at most {spec.max_len} values, not {len(array)}")
    if len(array) and array.dtype.kind == "f" and not np.isfinite(array).all():
        raise MessageError(name, "must be finite")
    if spec.low is not None and len(array) and array.min() < spec.low:
        raise MessageError(name, f"must be at least {spec.low}")
    if spec.high is not None and len(array) and array.max() > spec.high:
        raise MessageError(name, f"must be at most {spec.high}")
    return array


@message
class ShardState:
    """What a draw over a job's shards needs of each (services/buffer/sharding.py),
    as the shard was when it drew: the sum of its items' sampling weights (the share
    of the next draw it gets), and what its importance weights were normalized by
    (they are (weight / min_weight)^-beta). A consuming (fifo) shard's mass is the
    number of items it queues."""

    mass: Annotated[float, Ge(0)]
    min_weight: Annotated[float, Gt(0)]
    beta: Annotated[float, Ge(0), Le(1)]
    #: It hands each item out once, oldest first, held for the drawing task.
    consumes: bool = False


def batch_then_segment(segment: np.ndarray, batch_size: int) -> np.ndarray:
    """The order that puts drawn items (in drawn order, `segment[i]` each one's
    segment) in a reply's order: by batch of `batch_size`, then by segment, items of
    one segment in the order drawn."""
    return np.lexsort((segment, np.arange(len(segment)) // batch_size))


@dataclass
class SampledItems:
    """A sample reply's items as arrays, in the reply's order: batch after batch of
    `batch_size`, and within a batch grouped by segment (each segment's items in the
    order drawn). `segment[i]` indexes `paths`; `lengths` is None for transitions.

    The buffer draws into this form; a JSON client gets `reply()`, a frame client
    `frame()` (and rebuilds the same `SampleReply` on its side of the wire)."""

    batch_size: int
    keys: np.ndarray  # int64
    weights: np.ndarray  # float64
    segment: np.ndarray  # int32
    rows: np.ndarray  # int64
    lengths: np.ndarray | None  # int32
    paths: list[str]
    hold_id: str | None = None
    #: The shard that drew them, as it was then (a buffer process's draw; frames only).
    shard: ShardState | None = None

    @classmethod
    def empty(cls, hold_id: str | None = None) -> SampledItems:
        none = np.empty(0, np.int64)
        return cls(1, none, np.empty(0), np.empty(0, np.int32), none, None, [], hold_id)

    def reply(self) -> SampleReply:
        """The same items as a `SampleReply`: one entry per segment of each batch."""
        n = len(self.keys)
        if n == 0:
            return SampleReply(batches=[], hold_id=self.hold_id)
        batch_of = np.arange(n) // self.batch_size
        new_entry = np.ones(n, bool)
        new_entry[1:] = (self.segment[1:] != self.segment[:-1]) | (batch_of[1:] != batch_of[:-1])
        starts = np.flatnonzero(new_entry)
        # Python lists slice much faster than numpy splits into small arrays.
        bounds = [*starts.tolist(), n]
        row_list = self.rows.tolist()
        length_list = self.lengths.tolist() if self.lengths is not None else None
        paths = self.paths
        entries = [
            SampledSegment(
                path=paths[index],
                rows=row_list[a:b],
                lengths=length_list[a:b] if length_list is not None else None,
            )
            for index, a, b in zip(
                self.segment[starts].tolist(), bounds[:-1], bounds[1:], strict=True
            )
        ]
        # Each batch's first entry: entries run in batch order.
        firsts = np.searchsorted(batch_of[starts], np.arange(batch_of[-1] + 1)).tolist()
        firsts.append(len(entries))
        key_list, weight_list, size = self.keys.tolist(), self.weights.tolist(), self.batch_size
        batches = [
            SampledBatch(
                keys=key_list[i * size : (i + 1) * size],
                segments=entries[a:b],
                weights=weight_list[i * size : (i + 1) * size],
            )
            for i, (a, b) in enumerate(zip(firsts[:-1], firsts[1:], strict=True))
        ]
        return SampleReply(batches=batches, hold_id=self.hold_id)

    def frame(self) -> bytes:
        arrays = {
            "keys": self.keys.astype(np.int64, copy=False),
            "weights": self.weights.astype(np.float64, copy=False),
            "segment": self.segment.astype(np.int32, copy=False),
            "rows": self.rows.astype(np.int64, copy=False),
        }
        if self.lengths is not None:
            arrays["lengths"] = self.lengths.astype(np.int32, copy=False)
        message = {
            "batch_size": self.batch_size,
            "paths": self.paths,
            "hold_id": self.hold_id,
            "shard": dataclasses.asdict(self.shard) if self.shard is not None else None,
        }
        return frame(arrays, json.dumps(message))

    @classmethod
    def from_frame(cls, data: bytes) -> SampledItems:
        """The items of a sample reply's frame, checked to be consistent (one length,
        segment indexes inside `paths`, whole batches).

        Raises:
            MessageError: naming the first offending field.
        """
        arrays, text = unframe(data, SAMPLED_ARRAYS, "SampleReply")
        head = parse(_SampledMessage, text)
        for name in ("keys", "weights", "segment", "rows"):
            if name not in arrays:
                raise MessageError(name, "a SampleReply frame carries it")
        n = len(arrays["keys"])
        lengths = arrays.get("lengths")
        for name in ("weights", "segment", "rows", *(["lengths"] if lengths is not None else [])):
            if len(arrays[name]) != n:
                raise MessageError(name, f"holds {len(arrays[name])} values for {n} keys")
        if n and arrays["segment"].max() >= len(head.paths):
            raise MessageError("segment", f"indexes past the {len(head.paths)} paths")
        if n % head.batch_size:
            raise MessageError("keys", f"{n} items are not whole batches of {head.batch_size}")
        return cls(
            head.batch_size,
            arrays["keys"],
            arrays["weights"],
            arrays["segment"],
            arrays["rows"],
            lengths,
            head.paths,
            head.hold_id,
            head.shard,
        )


@message
class _SampledMessage:
    """A sample reply frame's JSON part."""

    batch_size: Annotated[int, Gt(0), Le(MAX_BATCH_SIZE)]
    paths: Annotated[list[str], MaxLen(MAX_SAMPLE_ITEMS)]
    hold_id: str | None = None
    shard: ShardState | None = None
