import numpy as np

from common.messages import SampledBatch, SampledSegment
from common.storage import SharedStore
from services.learner.algorithms.dqn import TransitionBatch
from services.learner.core import SegmentCache


def good(rows):
    return {
        "obs": np.arange(rows * 4, dtype=np.float32).reshape(rows, 4),
        "action": np.zeros(rows, np.int64),
        "reward": np.arange(rows, dtype=np.float32),
        "next_obs": np.zeros((rows, 4), np.float32),
        "done": np.zeros(rows, np.float32),
        "discount": np.ones(rows, np.float32),
    }


def test_bad_segments_cost_their_rows_not_the_batch(tmp_path):
    store = SharedStore(tmp_path)
    paths = [store.segment_path("job-1", "w", i) for i in range(4)]
    store.write_segment(paths[0], good(5))
    store.write_segment(paths[1], {"obs": np.zeros((5, 4), np.float32)})  # columns missing
    store.write_bytes(paths[2], b"\x10\x00\x00\x00\x00\x00\x00\x00{broken")  # corrupt
    store.write_segment(paths[3], good(2))  # rows out of range below
    batch = SampledBatch(
        keys=[10, 11, 20, 30, 40],
        segments=[
            SampledSegment(path=paths[0], rows=[1, 3]),
            SampledSegment(path=paths[1], rows=[0]),
            SampledSegment(path=paths[2], rows=[0]),
            SampledSegment(path=paths[3], rows=[7]),
        ],
        weights=[0.5, 1.0, 1.0, 1.0, 1.0],
    )
    cache = SegmentCache(store, "job-1", TransitionBatch.COLUMNS)
    columns, weights, keys = cache.gather(batch)
    assert keys == [10, 11] and weights.tolist() == [0.5, 1.0]
    assert columns["reward"].tolist() == [1.0, 3.0]
    assert cache.unusable == set(paths[1:])
    # an escaping path is refused like any unusable one
    outside = SampledBatch(keys=[1], segments=[SampledSegment(path="../x", rows=[0])], weights=[1])
    assert cache.gather(outside)[2] == []
