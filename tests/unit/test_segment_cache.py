import contextlib
import os
import threading
import time

import numpy as np
import pytest
from safetensors.numpy import save as st_save

from algorithms.registry import ALGORITHMS
from common.messages import SampledBatch, SampledSegment
from common.storage import SharedStore
from jobconfig import resolve_job_config, with_spaces
from services.learner.reads import BoundedReads
from services.learner.segments import SegmentCache, SegmentSchema

OBS, ACTIONS = 4, 3


def dqn_schema():
    config, _ = resolve_job_config({"policy": {"type": "dqn"}})
    return SegmentSchema.for_policy(
        with_spaces(config, OBS, ACTIONS).policy, ALGORITHMS["dqn"].column_names
    )


def sac_schema():
    config, _ = resolve_job_config({"policy": {"type": "sac"}})
    bounds = ([-1.0, -1.0], [1.0, 1.0])
    policy = with_spaces(config, OBS, 2, "continuous", bounds).policy
    return SegmentSchema.for_policy(policy, ALGORITHMS["sac"].column_names)


def good(rows, start=0.0):
    return {
        "obs": np.arange(rows * OBS, dtype=np.float32).reshape(rows, OBS) + start,
        "action": np.arange(rows, dtype=np.int64) % ACTIONS,
        "reward": np.arange(rows, dtype=np.float32) + start,
        "next_obs": np.zeros((rows, OBS), np.float32),
        "done": np.zeros(rows, np.float32),
        "discount": np.ones(rows, np.float32),
    }


def continuous(rows):
    columns = good(rows)
    columns["action"] = np.zeros((rows, 2), np.float32)
    return columns


def changed(columns, **replace):
    return {**columns, **replace}


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
    cache = SegmentCache(store, "job-1", dqn_schema())
    columns, weights, keys = cache.gather(batch)
    assert keys == [10, 11] and weights.tolist() == [0.5, 1.0]
    assert columns["reward"].tolist() == [1.0, 3.0]
    assert cache.unusable == set(paths[1:])
    # an escaping path is refused like any unusable one
    outside = SampledBatch(keys=[1], segments=[SampledSegment(path="../x", rows=[0])], weights=[1])
    assert cache.gather(outside)[2] == []


def test_a_good_segment_gathers_its_rows_as_training_columns(tmp_path):
    store = SharedStore(tmp_path)
    path = store.segment_path("job-1", "w", 0)
    store.write_segment(path, good(5))
    batch = SampledBatch(
        keys=[1, 2, 3], segments=[SampledSegment(path=path, rows=[4, 0, 4])], weights=[1, 2, 3]
    )
    cache = SegmentCache(store, "job-1", dqn_schema())
    columns, weights, keys = cache.gather(batch)
    source = good(5)
    assert sorted(columns) == sorted(ALGORITHMS["dqn"].column_names)
    for name in ALGORITHMS["dqn"].column_names:
        np.testing.assert_array_equal(columns[name], source[name][[4, 0, 4]])
    assert columns["obs"].dtype == np.float32 and columns["action"].dtype == np.int64
    assert keys == [1, 2, 3] and weights.tolist() == [1.0, 2.0, 3.0]
    assert cache.unusable == set()


def test_other_floating_and_flag_dtypes_are_cast_to_the_training_ones(tmp_path):
    store = SharedStore(tmp_path)
    path = store.segment_path("job-1", "w", 0)
    source = good(3)
    store.write_segment(
        path,
        changed(
            source,
            obs=source["obs"].astype(np.float64),
            reward=source["reward"].astype(np.float16),
            action=source["action"].astype(np.uint8),
            done=np.array([True, False, True]),
        ),
    )
    batch = SampledBatch(keys=[1], segments=[SampledSegment(path=path, rows=[2])], weights=[1])
    columns, _, keys = SegmentCache(store, "job-1", dqn_schema()).gather(batch)
    assert keys == [1]
    assert {k: v.dtype for k, v in columns.items()} == {
        "obs": np.float32,
        "action": np.int64,
        "reward": np.float32,
        "next_obs": np.float32,
        "done": np.float32,
        "discount": np.float32,
    }
    assert columns["obs"].tolist() == [[8.0, 9.0, 10.0, 11.0]] and columns["done"].tolist() == [1]


def raw_segment(columns):
    """A segment file written without the store's length check."""
    return st_save(columns)


BAD_DISCRETE = {
    "nan reward": lambda: changed(good(4), reward=np.array([0, np.nan, 0, 0], np.float32)),
    "inf obs": lambda: changed(good(4), obs=np.full((4, OBS), np.inf, np.float32)),
    "float64 overflowing float32": lambda: changed(good(4), obs=np.full((4, OBS), 1e300)),
    "wrong obs width": lambda: changed(good(4), obs=np.zeros((4, OBS + 1), np.float32)),
    "obs without rows axis": lambda: changed(good(4), next_obs=np.zeros((4,), np.float32)),
    "integer obs": lambda: changed(good(4), obs=np.zeros((4, OBS), np.int64)),
    "negative action": lambda: changed(good(4), action=np.array([0, -1, 0, 0])),
    "action == action_shape": lambda: changed(good(4), action=np.array([0, ACTIONS, 0, 0])),
    "float actions": lambda: changed(good(4), action=np.zeros(4, np.float32)),
    "action with a width": lambda: changed(good(4), action=np.zeros((4, 1), np.int64)),
    "done of 2": lambda: changed(good(4), done=np.array([0, 2, 0, 0], np.float32)),
    "nan done": lambda: changed(good(4), done=np.array([0, np.nan, 0, 0], np.float32)),
    "missing column": lambda: {k: v for k, v in good(4).items() if k != "discount"},
    "different lengths": lambda: changed(good(4), reward=np.zeros(3, np.float32)),
}


def write_bad(store, path, make):
    store.write_bytes(path, raw_segment(make()))


def write_fifo(store, path):
    store.resolve(path).parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(store.resolve(path))


def write_sparse(store, path):
    store.resolve(path).parent.mkdir(parents=True, exist_ok=True)
    with open(store.resolve(path), "wb") as f:
        f.truncate(1 << 40)


def assert_bad_segment_skipped(store, schema, bad_path, good_columns):
    good_a, good_b = (store.segment_path("job-1", "w", i) for i in (100, 101))
    store.write_segment(good_a, good_columns(5))
    store.write_segment(good_b, changed(good_columns(3), reward=np.float32([7, 8, 9])))
    batch = SampledBatch(
        keys=[10, 11, 20, 21, 30],
        segments=[
            SampledSegment(path=good_a, rows=[1, 3]),
            SampledSegment(path=bad_path, rows=[0, 2]),
            SampledSegment(path=good_b, rows=[2]),
        ],
        weights=[0.5, 0.25, 1.0, 1.0, 0.125],
    )
    cache = SegmentCache(store, "job-1", schema)
    columns, weights, keys = cache.gather(batch)
    assert keys == [10, 11, 30]
    assert weights.tolist() == [0.5, 0.25, 0.125]
    assert columns["reward"].tolist() == [1.0, 3.0, 9.0]
    assert all(len(v) == 3 for v in columns.values())
    assert cache.unusable == {bad_path}
    # listed once, and not read again
    assert cache.gather(batch)[2] == [10, 11, 30]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("case", sorted(BAD_DISCRETE))
def test_a_segment_that_does_not_fit_the_schema_is_skipped(tmp_path, case):
    store = SharedStore(tmp_path)
    bad = store.segment_path("job-1", "w", 0)
    write_bad(store, bad, BAD_DISCRETE[case])
    assert_bad_segment_skipped(store, dqn_schema(), bad, good)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("write", [write_fifo, write_sparse], ids=["fifo", "sparse 1 TiB"])
def test_a_file_that_is_not_a_readable_segment_is_skipped_at_once(tmp_path, write):
    store = SharedStore(tmp_path)
    bad = store.segment_path("job-1", "w", 0)
    write(store, bad)
    assert_bad_segment_skipped(store, dqn_schema(), bad, good)


BAD_CONTINUOUS = {
    "wrong action width": lambda: changed(continuous(4), action=np.zeros((4, 3), np.float32)),
    "scalar actions": lambda: changed(continuous(4), action=np.zeros(4, np.float32)),
    "integer actions": lambda: changed(continuous(4), action=np.zeros((4, 2), np.int64)),
    "nan action": lambda: changed(continuous(4), action=np.full((4, 2), np.nan, np.float32)),
}


@pytest.mark.parametrize("case", sorted(BAD_CONTINUOUS))
def test_continuous_actions_must_be_finite_floats_of_the_action_width(tmp_path, case):
    store = SharedStore(tmp_path)
    bad = store.segment_path("job-1", "w", 0)
    write_bad(store, bad, BAD_CONTINUOUS[case])
    assert_bad_segment_skipped(store, sac_schema(), bad, continuous)


def test_unrolls_must_have_the_configured_length(tmp_path):
    config, _ = resolve_job_config({"policy": {"type": "impala", "collect": {"unroll_len": 5}}})
    schema = SegmentSchema.for_policy(
        with_spaces(config, OBS, ACTIONS).policy, ALGORITHMS["impala"].column_names
    )
    store = SharedStore(tmp_path)

    def unrolls(items, steps):
        return {
            "obs": np.zeros((items, steps, OBS), np.float32),
            "action": np.zeros((items, steps), np.int64),
            "reward": np.ones((items, steps), np.float32),
            "logp": np.zeros((items, steps), np.float32),
            "done": np.zeros((items, steps), np.float32),
            "bootstrap_obs": np.zeros((items, OBS), np.float32),
            "truncated": np.zeros((items, steps), np.float32),
            "final_obs": np.zeros((items, steps, OBS), np.float32),
        }

    ok, short = store.segment_path("job-1", "w", 0), store.segment_path("job-1", "w", 1)
    store.write_segment(ok, unrolls(2, 5))
    store.write_segment(short, unrolls(2, 4))
    batch = SampledBatch(
        keys=[1, 2],
        segments=[SampledSegment(path=ok, rows=[1]), SampledSegment(path=short, rows=[0])],
        weights=[1, 1],
    )
    cache = SegmentCache(store, "job-1", schema)
    columns, _, keys = cache.gather(batch)
    assert keys == [1] and columns["obs"].shape == (1, 5, OBS)
    assert columns["bootstrap_obs"].shape == (1, OBS)
    assert cache.unusable == {short}


def test_a_batch_whose_keys_do_not_match_its_rows_trains_nothing(tmp_path):
    store = SharedStore(tmp_path)
    path = store.segment_path("job-1", "w", 0)
    store.write_segment(path, good(3))
    batch = SampledBatch(keys=[1], segments=[SampledSegment(path=path, rows=[0, 1])], weights=[1])
    columns, weights, keys = SegmentCache(store, "job-1", dqn_schema()).gather(batch)
    assert (columns, len(weights), keys) == ({}, 0, [])


def test_reading_ahead_on_another_thread_reads_each_segment_once(tmp_path, monkeypatch):
    import collections

    store = SharedStore(tmp_path)
    paths = [store.segment_path("job-1", "w", i) for i in range(20)]
    for i, path in enumerate(paths):
        store.write_segment(path, good(3, start=float(i)))
    reads: collections.Counter = collections.Counter()
    read_segment = store.read_segment

    def slow_read(path):
        reads[path] += 1
        time.sleep(0.01)  # long enough for both threads to want the same file
        return read_segment(path)

    monkeypatch.setattr(store, "read_segment", slow_read)
    cache = SegmentCache(store, "job-1", dqn_schema())
    batches = [
        SampledBatch(keys=[i], segments=[SampledSegment(path=p, rows=[1])], weights=[1.0])
        for i, p in enumerate(paths)
    ]
    reader = threading.Thread(target=cache.read_ahead, args=(batches,))
    reader.start()
    for i, batch in enumerate(batches):
        columns, _, keys = cache.gather(batch)
        assert keys == [i] and columns["reward"].tolist() == [1.0 + i]
    reader.join(timeout=10)
    assert not reader.is_alive()
    assert sorted(reads) == sorted(paths) and set(reads.values()) == {1}


def reads_without_a_bound(store, monkeypatch):
    """Make the store open segment files the blocking way, as a read on a hung mount
    does (or any open without O_NONBLOCK): a FIFO's open waits for a writer."""
    read_segment = store.read_segment

    def read(path):
        with open(store.resolve(path), "rb") as f:
            f.read()
        return read_segment(path)

    monkeypatch.setattr(store, "read_segment", read)


def end_of_file(store, path):
    """What an attacker's writer does at last: open the FIFO and close it (releasing a
    reader blocked in its open); nothing when no reader is waiting."""
    with contextlib.suppress(OSError):  # ENXIO: no reader
        os.close(os.open(store.resolve(path), os.O_WRONLY | os.O_NONBLOCK))


def within(seconds, call, *args):
    """`call(*args)` on a thread, which must return within `seconds`."""
    result = []
    thread = threading.Thread(target=lambda: result.append(call(*args)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert result, f"{call.__name__} did not return within {seconds} s"
    return result[0]


@pytest.mark.timeout(20)
def test_a_read_that_never_returns_costs_its_own_rows_not_the_batches_around_it(
    tmp_path, monkeypatch
):
    store = SharedStore(tmp_path)
    before, fifo, after = (store.segment_path("job-1", "w", i) for i in range(3))
    store.write_segment(before, good(4))
    write_fifo(store, fifo)
    store.write_segment(after, good(4, start=10.0))
    reads_without_a_bound(store, monkeypatch)
    cache = SegmentCache(store, "job-1", dqn_schema(), read_timeout_s=0.5)

    def batch(*segments):
        rows = [row for _, rows in segments for row in rows]
        return SampledBatch(
            keys=rows,
            segments=[SampledSegment(path=p, rows=r) for p, r in segments],
            weights=[1.0] * len(rows),
        )

    batches = [
        batch((before, [1]), (fifo, [0, 1]), (after, [2])),
        batch((fifo, [3]), (after, [3])),
        batch((before, [0])),
    ]
    try:
        started = time.monotonic()
        # The batches after the first are read ahead while the first trains.
        reader = threading.Thread(target=cache.read_ahead, args=(batches[1:],), daemon=True)
        reader.start()
        columns, _, keys = within(5, cache.gather, batches[0])
        assert keys == [1, 2] and columns["reward"].tolist() == [1.0, 12.0]
        assert cache.unusable == {fifo}
        assert within(5, cache.gather, batches[1])[2] == [3]
        assert within(5, cache.gather, batches[2])[2] == [0]
        # One wait of the bound in all, however many threads asked for the file.
        assert time.monotonic() - started < 2.5
        reader.join(5)
        assert not reader.is_alive(), "reading ahead did not end"
        # The writer's end of file changes nothing: the file stays skipped.
        end_of_file(store, fifo)
        started = time.monotonic()
        assert within(5, cache.gather, batches[0])[2] == [1, 2]
        assert time.monotonic() - started < 0.5 and cache.unusable == {fifo}
    finally:
        end_of_file(store, fifo)  # a read still blocked in its open ends


@pytest.mark.timeout(10)
def test_a_read_past_its_bound_gives_its_place_to_the_reads_after_it():
    reads = BoundedReads(size=1, name="test-read")
    release = threading.Event()
    try:
        stuck = reads.submit(release.wait)
        with pytest.raises(TimeoutError):
            reads.result(stuck, 0.1)
        # The one thread is still in the stuck read: another took its place.
        assert reads.result(reads.submit(lambda: 42), 5) == 42
        assert reads.threads_started == 2
    finally:
        release.set()


@pytest.mark.timeout(10)
def test_a_read_given_up_before_it_started_is_dropped():
    reads = BoundedReads(size=1, name="test-read")
    release, ran = threading.Event(), []
    try:
        busy = reads.submit(release.wait)
        queued = reads.submit(lambda: ran.append(1))
        with pytest.raises(TimeoutError):
            reads.result(queued, 0.1)
        release.set()
        assert reads.result(busy, 5) is True
        assert reads.result(reads.submit(lambda: "after"), 5) == "after"
        assert ran == [] and reads.threads_started == 1  # no thread was stuck
    finally:
        release.set()
