"""Binary frames of the hot data routes: what a learner sends and gets back is the
message the JSON form carries, and a frame that does not hold together is refused
naming its field."""

import json

import numpy as np
import pytest

from common.array_bodies import (
    SAMPLE_REQUEST_ARRAYS,
    SampledItems,
    decode,
    encode,
    frame,
)
from common.messages import MessageError, SampleRequest


def items(**change):
    fields = dict(
        batch_size=2,
        keys=np.array([5, 6, 7, 8]),
        weights=np.array([1.0, 0.5, 0.25, 1.0]),
        segment=np.array([0, 1, 0, 0], np.int32),
        rows=np.array([3, 4, 5, 6]),
        lengths=np.array([2, 2, 1, 4], np.int32),
        paths=["job-1/segments/w/0.safetensors", "job-1/segments/w/1.safetensors"],
        hold_id="hold-3",
    )
    return SampledItems(**{**fields, **change})


def test_a_sample_request_survives_its_frame():
    request = SampleRequest(
        batch_size=64,
        num_batches=8,
        timeout_s=2.5,
        task_id="learn-1",
        acknowledge=["hold-1", "hold-2"],
        priority_keys=[1, 2**62, 3],
        priorities=[0.5, 1e6, 0.0],
    )
    assert decode(SampleRequest, encode(request, SAMPLE_REQUEST_ARRAYS), SAMPLE_REQUEST_ARRAYS) == (
        request
    )
    bare = SampleRequest(batch_size=1)
    assert decode(SampleRequest, encode(bare, SAMPLE_REQUEST_ARRAYS), SAMPLE_REQUEST_ARRAYS) == bare


@pytest.mark.parametrize("lengths", [None, np.array([2, 2, 1, 4], np.int32)])
def test_sampled_items_survive_their_frame(lengths):
    sent = items(lengths=lengths)
    got = SampledItems.from_frame(sent.frame())
    assert got.reply() == sent.reply()
    reply = got.reply()
    assert [b.keys for b in reply.batches] == [[5, 6], [7, 8]]
    assert [len(b.segments) for b in reply.batches] == [2, 1]  # one entry a segment
    assert reply.batches[1].segments[0].rows == [5, 6] and reply.hold_id == "hold-3"
    assert SampledItems.from_frame(SampledItems.empty().frame()).reply().batches == []


THREE_ITEMS = {
    "keys": np.array([5, 6, 7]),
    "rows": np.array([5, 6, 7]),
    "weights": np.ones(3),
    "segment": np.zeros(3, np.int32),
}


@pytest.mark.parametrize(
    "change, field",
    [
        ({"weights": np.array([1.0, 0.5])}, "weights"),
        ({"segment": np.array([0, 2, 0, 0], np.int32)}, "segment"),
        ({"rows": np.array([3, -4, 5, 6])}, "rows"),
        (THREE_ITEMS, "keys"),  # not whole batches of 2
        ({"segment": np.array([0, 1, 0, 0], np.int64)}, "segment"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_a_reply_frame_that_does_not_hold_together_is_refused(change, field):
    sent = {
        "keys": np.array([5, 6, 7, 8]),
        "weights": np.ones(4),
        "segment": np.zeros(4, np.int32),
        "rows": np.array([3, 4, 5, 6]),
        **{k: v for k, v in change.items() if k != "batch_size"},
    }
    head = {"batch_size": change.get("batch_size", 2), "paths": ["a", "b"], "hold_id": None}
    with pytest.raises(MessageError) as err:
        SampledItems.from_frame(frame(sent, json.dumps(head)))
    assert err.value.field == field


@pytest.mark.parametrize(
    "arrays, field",
    [
        ({"priority_keys": np.zeros((2, 2), np.int64)}, "priority_keys"),
        ({"priority_keys": np.zeros(65_537, np.int64)}, "priority_keys"),
        ({"priorities": np.array([np.inf])}, "priorities"),
        ({"priorities": np.array([2e6])}, "priorities"),
        ({"extra": np.zeros(1)}, "extra"),
    ],
)
def test_a_request_frame_with_a_bad_array_names_it(arrays, field):
    with pytest.raises(MessageError) as err:
        decode(SampleRequest, frame(arrays, '{"batch_size": 1}'), SAMPLE_REQUEST_ARRAYS)
    assert err.value.field == field


def test_bytes_that_are_no_frame_are_refused():
    for data in (b"", b"{}", b"\xff" * 16, frame({}, "not json")):
        with pytest.raises(MessageError):
            decode(SampleRequest, data, SAMPLE_REQUEST_ARRAYS)
