import dataclasses
import threading
import time

import numpy as np
import pytest

from common.array_bodies import SampledItems
from common.config import ReplayBufferConfig
from common.messages import SampledBatch, SampledSegment, SegmentRef
from services.buffer.core import BufferClosed, RateLimited, ReplayBuffer, SampleTimeout
from services.buffer.limiter import RateLimiter
from tests.fakes import DeletedFiles
from tests.helpers import wait_until


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def ref(seq, rows=10, worker="w"):
    return SegmentRef(
        path=f"job-1/segments/{worker}/{seq:08d}.safetensors",
        rows=rows,
        env_steps=rows,
        policy_version=0,
    )


def make(capacity=100, min_size=1, spi=None, error_buffer=0.0, **kw):
    config = ReplayBufferConfig(
        replay_buffer_size=capacity, min_size_to_sample=min_size, samples_per_insert=spi
    )
    files = DeletedFiles()
    buf = ReplayBuffer("job-1", config, files, error_buffer=error_buffer, **kw)
    return buf, files


def test_insert_is_idempotent_by_path():
    buf, _ = make()
    first = buf.insert([ref(0), ref(1)])
    assert (first.accepted, first.duplicates) == (2, 0)
    again = buf.insert([ref(1), ref(1), ref(2)])
    assert (again.accepted, again.duplicates) == (1, 2)
    assert buf.size == 30 and buf.stats().inserts == 30


def test_paths_of_other_jobs_or_layouts_are_refused():
    buf, _ = make()
    for path in ["job-2/segments/w/00000001.safetensors", "job-1/policies/1.safetensors"]:
        with pytest.raises(ValueError, match="is not"):
            buf.insert([SegmentRef(path=path, rows=1, env_steps=1, policy_version=0)])


def test_fifo_eviction_releases_fully_evicted_segments_after_grace():
    clock = FakeClock()
    buf, files = make(capacity=25, clock=clock, release_grace_s=5.0)
    buf.insert([ref(0), ref(1)])
    buf.sample(5, 1, timeout_s=0)  # segments sampled at t=0
    clock.now = 1.0
    buf.insert([ref(2)])  # evicts the first 5 rows of segment 0 only
    assert files.deleted == []
    buf.insert([ref(3)])  # segment 0 fully evicted, but sampled 1s ago
    assert files.deleted == []
    assert buf.stats().evictions["capacity"] == 15
    clock.now = 10.0
    buf.collect_garbage()
    assert files.deleted == ["job-1/segments/w/00000000.safetensors"]
    # a re-sent segment whose rows were already evicted still counts once
    assert buf.insert([ref(0)]).duplicates == 1


def test_sampled_rows_and_keys_point_at_live_items():
    buf, _ = make(capacity=30)
    for seq in range(5):  # 50 rows into 30 slots: keys 20..49 live
        buf.insert([ref(seq)])
    batches = buf.sample(16, 4, timeout_s=0)
    for batch in batches:
        assert len(batch.keys) == 16 == sum(len(s.rows) for s in batch.segments)
        rows = [(s.path, r) for s in batch.segments for r in s.rows]
        slots, live = buf.table.slots_of(batch.keys)
        assert live.all()  # every key is of an item still in the buffer
        for slot, (path, row) in zip(slots, rows, strict=True):
            seq = int(path.rsplit("/", 1)[1].split(".")[0])
            assert seq >= 2  # segments 0 and 1 were evicted
            assert buf.table.row[slot] == row


def test_sample_waits_for_data_then_times_out():
    buf, _ = make(min_size=20)
    buf.insert([ref(0)])
    t0 = time.monotonic()
    with pytest.raises(SampleTimeout):
        buf.sample(4, 1, timeout_s=0.2)
    assert time.monotonic() - t0 >= 0.19


def test_sample_long_poll_is_released_by_an_insert():
    buf, _ = make(min_size=20)
    buf.insert([ref(0)])
    got = []
    t = threading.Thread(target=lambda: got.append(buf.sample(4, 1, timeout_s=5)))
    t.start()
    wait_until(lambda: buf.stats().waiting_samplers, 5, "the sample to wait")
    buf.insert([ref(1)])
    t.join(5)
    assert len(got) == 1 and len(got[0][0].keys) == 4


def test_rate_limiter_blocks_inserts_until_samples_catch_up():
    # 1 sample per insert, band of 15 items: after min_size, inserts may run 15 ahead.
    buf, _ = make(capacity=1000, min_size=10, spi=1.0, error_buffer=15.0)
    buf.insert([ref(0)])  # 10 rows: up to min_size is always allowed
    buf.insert([ref(1)])  # diff = 1*(20-10) - 0 = 10 <= 15
    with pytest.raises(RateLimited):
        buf.insert([ref(2)], timeout_s=0.05)  # would be 20 > 15
    released = []
    t = threading.Thread(target=lambda: released.append(buf.insert([ref(2)], timeout_s=5)))
    t.start()
    wait_until(lambda: buf.stats().waiting_inserters, 5, "the insert to wait")
    assert released == []
    buf.sample(10, 1, timeout_s=0)  # diff falls to 0: the waiting insert proceeds
    t.join(5)
    assert released and released[0].accepted == 1


def test_inserts_waiting_beyond_the_bound_are_refused_at_once_and_a_sample_frees_them():
    # 32 collectors' inserts once held every one of a buffer process's 16 threads, so
    # the learner's sample, the only request that lets them go, was never served.
    buf, _ = make(capacity=1000, min_size=10, spi=1.0, error_buffer=15.0, max_waiting_inserts=2)
    buf.insert([ref(0)])
    buf.insert([ref(1)])  # from here every insert waits for a sample
    results = []
    # Two collectors' inserts (one collector's go one at a time, in order: a later
    # one's sequence number makes an earlier one a duplicate, whichever wakes first).
    waiters = [
        threading.Thread(
            target=lambda w=w: results.append(buf.insert([ref(2, worker=w)], timeout_s=5))
        )
        for w in ("a", "b")
    ]
    for t in waiters:
        t.start()
    wait_until(lambda: buf.stats().waiting_inserters == 2, 5, "two inserts to wait")
    started = time.monotonic()
    with pytest.raises(RateLimited) as refused:
        buf.insert([ref(4)], timeout_s=5)  # a third would wait: answered now
    assert time.monotonic() - started < 0.5
    assert 0.1 <= refused.value.retry_after_s <= 0.4
    buf.sample(20, 1, timeout_s=0)  # the learner catches up: both waiting inserts go in
    for t in waiters:
        t.join(5)
    assert [r.accepted for r in results] == [1, 1]
    # An insert the limiter admits is never refused, whatever waits.
    assert buf.insert([ref(1)], timeout_s=5).duplicates == 1


def test_rate_limiter_blocks_samples_until_inserts_catch_up():
    limiter = RateLimiter(samples_per_insert=2.0, min_size_to_sample=10, error_buffer=8.0)
    limiter.inserted = 10
    assert limiter.can_sample(8) and not limiter.can_sample(9)
    limiter.sampled = 8
    assert not limiter.can_sample(1)
    limiter.inserted += 1  # one insert is worth two samples
    assert limiter.can_sample(2) and not limiter.can_sample(3)


@pytest.mark.parametrize(
    ("batch_size", "num_batches", "n_sample", "spi", "error_buffer"),
    [(64, 8, 64, 16.0, None), (32, 1, 8, 4.0, None), (256, 4, 100, 1.0, 700.0), (8, 2, 4, 0.5, 20)],
)
def test_an_insert_of_the_bound_gets_through_whenever_sampling_waits(
    batch_size, num_batches, n_sample, spi, error_buffer
):
    """`insert_rows_bound`: the limiter never holds both a request and such an insert."""
    from jobconfig import error_buffer_of, insert_rows_bound, resolve_job_config

    raw = {
        "policy": {
            "type": "dqn",
            "learn": {"batch_size": batch_size, "num_batches": num_batches},
            "collect": {"n_sample": n_sample},
            "other": {
                "replay_buffer": {
                    "samples_per_insert": spi,
                    "error_buffer": error_buffer,
                    "min_size_to_sample": 100,
                }
            },
        }
    }
    config, _ = resolve_job_config(raw)
    bound = insert_rows_bound(config)
    assert bound >= n_sample  # what the error buffer was sized for still fits
    limiter = RateLimiter(spi, 100, error_buffer_of(config))
    request = batch_size * num_batches
    # From an empty buffer (nothing samples below min_size_to_sample) onwards.
    for inserted in range(0, 3000, 7):
        limiter.inserted = inserted
        for sampled in range(0, int(spi * 3000), max(1, request // 31)):
            limiter.sampled = sampled
            assert limiter.can_sample(request) or limiter.can_insert(bound)


def test_close_wakes_waiters_and_refuses_more():
    buf, _ = make(min_size=50)
    errors = []

    def waiter():
        try:
            buf.sample(4, 1, timeout_s=10)
        except BufferClosed as exc:
            errors.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    wait_until(lambda: buf.stats().waiting_samplers, 5, "the sample to wait")
    buf.close()
    t.join(5)
    assert len(errors) == 1
    with pytest.raises(BufferClosed):
        buf.insert([ref(0)])


def test_segment_larger_than_capacity_keeps_newest_rows():
    buf, _ = make(capacity=8)
    buf.insert([ref(0, rows=20)])
    rows = sorted(r for b in buf.sample(8, 4, timeout_s=0) for s in b.segments for r in s.rows)
    assert set(rows) <= set(range(12, 20))
    assert np.unique(rows).size > 1


def test_a_file_indexed_while_its_insert_waits_counts_once():
    # The interleaving a chaos run found: an insert waits in the limiter; meanwhile the
    # orphan sweep indexes the same file (force); then the insert goes through.
    buf, files = make(capacity=1000, min_size=10, spi=1.0, error_buffer=15.0)
    buf.insert([ref(0)])
    buf.insert([ref(1)])
    waiting = []
    t = threading.Thread(target=lambda: waiting.append(buf.insert([ref(2)], timeout_s=5)))
    t.start()
    wait_until(lambda: buf.stats().waiting_inserters, 5, "the insert to wait")
    swept = buf.insert([ref(2)], force=True)  # the sweep finds the file on disk
    assert swept.accepted == 1
    buf.sample(30, 1, timeout_s=0)  # lets the waiting insert go on
    t.join(5)
    # Indexed once, by the sweep: the insert claims it (its sender's, not a duplicate).
    (late,) = waiting
    assert (late.accepted, late.claimed, late.duplicates) == (0, 1, 0)
    stats = buf.stats()
    assert stats.inserts == 30 and stats.live_segments == 3
    buf.release_all()  # releasing is total: every file once, no error
    assert sorted(files.deleted) == sorted(ref(i).path for i in range(3))


def test_the_first_insert_of_a_file_the_sweep_indexed_claims_it_and_a_retry_is_a_duplicate():
    # A buffer process starting sweeps every file at once, among them one whose insert
    # is on its way: that insert is its sender's own, answered as such; only a retry of
    # it, or of an insert answered before, is a duplicate.
    buf, _ = make(capacity=1000)
    buf.insert([ref(0)])
    swept = buf.insert([ref(1)], force=True)
    assert (swept.accepted, swept.claimed) == (1, 0)
    first = buf.insert([ref(0), ref(1), ref(2)])
    assert (first.accepted, first.claimed, first.duplicates) == (1, 1, 1)
    again = buf.insert([ref(1), ref(2)])
    assert (again.accepted, again.claimed, again.duplicates) == (0, 0, 2)
    assert buf.stats().inserts == 30 and buf.inserted_env_steps == 30


def _grouped_batch_by_batch(buf, batch_size, keys, sids, rows, lengths, weights, spans):
    """What a reply held when each batch was grouped on its own: its items sorted by
    segment id (a stable sort: a segment's items in drawn order), one entry a segment."""
    batches = []
    for start in range(0, len(keys), batch_size):
        order = sorted(range(start, start + batch_size), key=lambda i: sids[i])
        entries: list[list] = []
        for i in order:
            if entries and entries[-1][0] == sids[i]:
                entries[-1][1].append(rows[i])
                entries[-1][2].append(lengths[i])
            else:
                entries.append([sids[i], [rows[i]], [lengths[i]]])
        segments = [
            SampledSegment(path=buf._segments[s].path, rows=r, lengths=n if spans else None)
            for s, r, n in entries
        ]
        batches.append(
            SampledBatch(
                keys=[keys[i] for i in order],
                segments=segments,
                weights=[weights[i] for i in order],
            )
        )
    return batches


@pytest.mark.parametrize("item", ["transition", "episode"])
def test_a_reply_groups_each_batch_by_segment_in_drawn_order(item):
    # Segments that recur within a batch, out of order, and across batches.
    config = ReplayBufferConfig(
        replay_buffer_size=1000, min_size_to_sample=1, item=item, sequence_length=4
    )
    buf = ReplayBuffer("job-1", config, DeletedFiles(), error_buffer=0.0)
    for seq in range(5):
        buf.insert([dataclasses.replace(ref(seq, rows=20), episodes=[(0, 10), (10, 10)])])
    ids = sorted(buf._segments)
    rng = np.random.default_rng(3)
    batch_size, num_batches = 8, 4
    n = batch_size * num_batches
    sids = rng.choice(ids, n)
    keys, rows, lengths = (rng.integers(0, 20, n) for _ in range(3))
    weights = rng.random(n)
    drawn = buf._group(batch_size, keys, sids, rows, lengths, weights, None)
    got = drawn.reply().batches
    want = _grouped_batch_by_batch(
        buf,
        batch_size,
        *(a.tolist() for a in (keys, sids, rows, lengths, weights)),
        spans=item != "transition",
    )
    assert got == want
    # The same items through a binary frame (what a learner asks for).
    assert SampledItems.from_frame(drawn.frame()).reply().batches == want
    empty = buf._group(batch_size, *(a[:0] for a in (keys, sids, rows, lengths, weights)), None)
    assert empty.reply().batches == []
