"""A batch's rows gathered from many segments at once: the same rows, in the same order,
as taking each segment's rows in turn, with the same rows left out."""

import numpy as np
import pytest

from algorithms.registry import ALGORITHMS
from common.messages import SampledBatch, SampledSegment
from common.storage import SharedStore
from jobconfig import resolve_job_config, with_spaces
from services.learner import segments as segments_module
from services.learner.segments import SegmentCache, SegmentSchema

ROWS = 8


def schema():
    config, _ = resolve_job_config({"policy": {"type": "dqn"}})
    policy = with_spaces(config, 4, 2).policy
    return SegmentSchema.for_policy(policy, ALGORITHMS["dqn"].column_names)


def segment(seq):
    """Rows whose values say which segment and row they are: seq * 100 + row."""
    values = seq * 100 + np.arange(ROWS, dtype=np.float32)
    return {
        "obs": np.repeat(values[:, None], 4, axis=1),
        "action": np.arange(ROWS) % 2,
        "reward": values,
        "next_obs": np.zeros((ROWS, 4), np.float32),
        "done": np.zeros(ROWS, np.float32),
        "discount": np.ones(ROWS, np.float32),
    }


#: The ways a gather joins rows: each segment as one record array, joined whole or
#: only its rows; or column by column (rows too big for records), whole or rows only.
JOINS = {
    "records, whole": {},
    "records, rows only": {"JOIN_WHOLE_BYTES": 0},
    "columns, whole": {"RECORD_ROW_BYTES": 0},
    "columns, rows only": {"RECORD_ROW_BYTES": 0, "JOIN_WHOLE_BYTES": 0},
}


@pytest.mark.parametrize("join", JOINS)
def test_rows_of_many_segments_come_in_batch_order_and_bad_entries_cost_their_rows(
    tmp_path, monkeypatch, join
):
    for name, value in JOINS[join].items():
        monkeypatch.setattr(segments_module, name, value)
    store = SharedStore(tmp_path)
    paths = [store.segment_path("job-1", "w", i) for i in range(40)]
    for seq, path in enumerate(paths):
        store.write_segment(path, segment(seq))
    rng = np.random.default_rng(0)
    entries = [(seq, sorted(rng.integers(0, ROWS, 3).tolist())) for seq in range(0, 40, 2)]
    entries.insert(5, (1, [0, ROWS]))  # a row past the end: the entry and its segment go
    entries.append((1, [2]))  # the same segment again: skipped already
    entries.append((3, []))  # no rows: nothing to take
    batch = SampledBatch(
        keys=list(range(sum(len(rows) for _, rows in entries))),
        segments=[SampledSegment(path=paths[seq], rows=rows) for seq, rows in entries],
        weights=[0.5] * sum(len(rows) for _, rows in entries),
    )
    cache = SegmentCache(store, "job-1", schema())
    columns, weights, keys = cache.gather(batch)
    expected = [seq * 100 + row for seq, rows in entries if seq != 1 for row in rows]
    assert columns["reward"].tolist() == expected
    assert columns["obs"][:, 3].tolist() == expected and columns["obs"].dtype == np.float32
    assert columns["action"].tolist() == [
        row % 2 for seq, rows in entries if seq != 1 for row in rows
    ]
    # Columns of their own, as torch takes them (not strided views of records).
    assert all(c.flags.c_contiguous and c.base is None for c in columns.values())
    assert len(keys) == len(weights) == len(expected)
    assert keys == list(range(5 * 3)) + list(range(5 * 3 + 2, len(batch.keys) - 1))
    assert cache.unusable == {paths[1]}
    # A segment kept as records holds its rows once: its columns are views of them.
    entry = cache._entry(paths[0])
    if entry.record is not None:
        assert all(np.shares_memory(c, entry.record) for c in entry.columns.values())
    assert (entry.record is not None) == ("RECORD_ROW_BYTES" not in JOINS[join])


def test_a_row_past_int64_costs_its_segment_alone(tmp_path):
    store = SharedStore(tmp_path)
    paths = [store.segment_path("job-1", "w", i) for i in range(2)]
    for seq, path in enumerate(paths):
        store.write_segment(path, segment(seq))
    batch = SampledBatch(
        keys=[1, 2],
        segments=[
            SampledSegment(path=paths[0], rows=[2**70]),
            SampledSegment(path=paths[1], rows=[3]),
        ],
        weights=[1.0, 1.0],
    )
    columns, _, keys = SegmentCache(store, "job-1", schema()).gather(batch)
    assert keys == [2] and columns["reward"].tolist() == [103.0]
