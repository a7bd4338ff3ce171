"""Snapshots of a buffer that keeps changing: one consistent cut, derived state.

`ReplayBuffer.cut` takes the small state at one instant and copies the columns
without the lock; the tests check that what comes back is exactly the buffer at the
cut (against copies taken inside `at_cut`, and a snapshot taken there with the lock
held throughout), and that what a snapshot no longer saves (the free list, the
arrival order, the sum tree, each segment's item count) is derived back exactly.
"""

import base64
import json
import threading
import time

import numpy as np
import pytest

from services.buffer.table import COLUMNS
from tests.buffers import (
    PER,
    assert_columns_equal,
    assert_same_tree,
    churn,
    columns,
    make,
    quiet,
    ref,
    restored,
)

# --- one cut -------------------------------------------------------------------------


def test_writes_after_the_cut_are_not_in_the_snapshot():
    # `at_cut` runs at the cut: what it changes comes after it, while the columns are
    # still to be copied, so the snapshot must undo every one of those writes.
    buf = make(seed=3, replay_buffer_size=300, max_use=4, max_staleness=2, **PER)
    rng = np.random.default_rng(0)
    for seq in range(30):
        churn(buf, seq, rng)

    def at_cut():
        oracle = (columns(buf), buf.stats(), buf.snapshot())  # the lock is held throughout
        for seq in range(30, 60):
            churn(buf, seq, rng)
        return oracle

    taken = buf.cut(at_cut)
    at, stats, (data, meta) = taken.at_cut
    assert not np.array_equal(buf.table.key, at["key"])  # the buffer did move on
    assert bytes(taken.data) == bytes(data) and taken.meta == meta
    copy = restored(buf, taken.data, taken.meta)
    assert_columns_equal(columns(copy), at)
    assert copy.stats() == stats


def test_a_snapshot_under_load_restores_to_the_state_at_its_cut():
    # Other threads insert (evicting), sample, send priorities and move the learner
    # (staleness evictions) while snapshots are taken, two at a time.
    buf = make(seed=5, replay_buffer_size=400_000, max_staleness=3, **PER)
    for seq in range(200):
        buf.insert([ref(seq, rows=2000)])
    stop = threading.Event()
    errors = []

    def loop(step):
        rng = np.random.default_rng(len(errors))
        seq = 10_000 * (1 + threading.get_ident() % 7)
        try:
            while not stop.is_set():
                seq += 1
                step(seq, rng)
        except Exception as exc:  # reported below, so a failure names its cause
            errors.append(exc)

    def insert(seq, rng):
        buf.insert([ref(seq, rows=500, version=buf.stats().learner_version)], force=True)

    def sample(seq, rng):
        for batch in buf.sample(256, 4, timeout_s=1.0):
            buf.update_priorities(batch.keys, rng.uniform(0.01, 5.0, 256).tolist())

    def learn(seq, rng):
        buf.set_learner_version(seq % 1000)
        time.sleep(0.001)

    def snapshots(seq, rng):
        buf.cut()

    threads = [threading.Thread(target=loop, args=(s,)) for s in (insert, sample, learn, snapshots)]
    for t in threads:
        t.start()
    try:
        busy = 0  # cuts during whose copy the others changed the buffer
        for _ in range(50):
            taken = buf.cut(lambda: (columns(buf), buf.stats(), buf.snapshot()))
            at, stats, (data, meta) = taken.at_cut
            busy += buf.stats().sample_requests > stats.sample_requests
            assert bytes(taken.data) == bytes(data) and taken.meta == meta
            copy = restored(buf, taken.data, taken.meta)
            assert_columns_equal(columns(copy), at)
            assert copy.stats() == quiet(stats)
            # The same draws from here on as a buffer stopped at the cut.
            truth = restored(buf, data, meta)
            assert copy.sample(64, 4, timeout_s=0) == truth.sample(64, 4, timeout_s=0)
            assert copy.inserted_env_steps == truth.inserted_env_steps
            if busy == 3:
                break
        assert busy == 3, "the other threads never changed the buffer during a cut"
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert errors == []


def test_snapshot_bytes_still_held_are_never_written_over():
    # A snapshot writes over the last one's buffer only once nobody holds its bytes.
    buf = make(seed=2, replay_buffer_size=500, max_use=3, **PER)
    rng = np.random.default_rng(4)
    for seq in range(40):
        churn(buf, seq, rng)
    first = buf.cut()
    kept = bytes(first.data)
    churn(buf, 40, rng)
    second = buf.cut()
    assert bytes(first.data) == kept
    del first
    for seq in range(41, 45):
        churn(buf, seq, rng)
        now = columns(buf)
        taken = buf.cut()
        assert_columns_equal(columns(restored(buf, taken.data, taken.meta)), now)
    assert restored(buf, second.data, second.meta).stats() != buf.stats()


# --- what is derived at restore ----------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        dict(replay_buffer_size=64, max_use=3, max_staleness=1, eviction="fifo", **PER),
        dict(replay_buffer_size=64, max_use=2, eviction="lifo", type="uniform"),
        dict(replay_buffer_size=64, max_staleness=2, eviction="uniform", **PER),
        dict(replay_buffer_size=64, type="fifo"),
    ],
    ids=["per-fifo", "uniform-lifo", "per-uniform", "queue"],
)
def test_free_list_arrival_order_and_sum_tree_come_back_exactly(config):
    buf = make(seed=11, **config)
    rng = np.random.default_rng(1)
    seq = 0
    # Until items have left and there are holes, freed in an order the keys must keep.
    while seq < 20 or not 2 <= buf.table.free_count < 62:
        churn(buf, seq, rng)
        seq += 1
        assert seq < 100
    assert sum(buf.stats().evictions.values()) > 0
    data, meta = buf.snapshot()
    assert "free" not in meta and "segments" not in meta
    copy = restored(buf, data, meta)
    assert_same_tree(copy, buf)  # rebuilt from the priorities, to the last bit
    rng, same_rng = np.random.default_rng(2), np.random.default_rng(2)
    for step in range(seq, seq + 20):  # new items take the same slots, the same items leave
        churn(buf, step, rng)
        churn(copy, step, same_rng)
        assert_columns_equal(columns(copy), columns(buf))
        assert copy.stats() == buf.stats()
        batch_size = min(4, buf.size // 2)
        if batch_size:
            assert copy.sample(batch_size, 2, timeout_s=0) == buf.sample(batch_size, 2, timeout_s=0)
        assert_same_tree(copy, buf)


def test_new_items_weigh_in_the_sum_tree_what_restore_rebuilds():
    # A new item's weight is max_priority^alpha; restore rebuilds it from the priority
    # column with numpy, which must be how it was computed (Python's ** can differ).
    buf = make(replay_buffer_size=400, **PER)
    for seq in range(200):
        buf.insert([ref(seq, rows=1)])
        (batch,) = buf.sample(1, 1, timeout_s=0)
        buf.update_priorities(batch.keys, [1.0 + 0.0371 * seq])  # a new highest priority
    data, meta = buf.snapshot()
    assert_same_tree(restored(buf, data, meta), buf)


def test_segment_item_counts_are_counted_again_and_files_released_alike():
    config = dict(replay_buffer_size=30, max_use=2, type="fifo")
    buf = make(**config)
    for seq in range(5):
        buf.insert([ref(seq)])  # 50 items into 30 slots: segments 0 and 1 evicted
    buf.sample_for("learn-1", 5, 1, timeout_s=0)  # 5 items of segment 2 held
    data, meta = buf.snapshot()
    copy = restored(buf, data, meta)
    assert copy.stats().live_segments == buf.stats().live_segments == 3
    assert copy.size == 30  # the held items are back, as the newest
    copy.insert([ref(5, rows=30)])  # evicts every old item: each file goes once
    assert sorted(copy._files.deleted) == [ref(i).path for i in range(2, 5)]


# --- the caller's record, env steps, the cut's lock ------------------------------------


def test_at_cut_record_and_inserted_env_steps_agree_at_the_cut():
    buf = make(replay_buffer_size=100)
    buf.insert([ref(0, rows=10)])
    buf.insert([ref(1, rows=7)], force=True)
    assert buf.insert([ref(1, rows=7)]).claimed == 1  # its insert comes: counted once
    assert buf.inserted_env_steps == 17
    order = threading.Lock()
    taken = buf.cut(lambda: (order.locked(), buf.inserted_env_steps), cut_lock=order)
    assert taken.at_cut == (True, 17) and not order.locked()
    assert taken.meta["inserted_env_steps"] == 17
    assert restored(buf, taken.data, taken.meta).inserted_env_steps == 17
    assert taken.longest_lock_hold_s <= taken.duration_s


def test_a_failing_at_cut_leaves_the_buffer_working():
    buf = make(replay_buffer_size=100)
    buf.insert([ref(0)])
    with pytest.raises(RuntimeError):
        buf.cut(lambda: (_ for _ in ()).throw(RuntimeError("record")))
    buf.sample(4, 1, timeout_s=0)
    data, meta = buf.snapshot()
    assert restored(buf, data, meta).stats() == buf.stats()


def test_columns_change_only_through_the_table():
    buf = make(replay_buffer_size=10)
    buf.insert([ref(0)])
    for column in COLUMNS:
        with pytest.raises(ValueError, match="read-only"):
            getattr(buf.table, column)[0] = 1


# --- the first snapshot format ------------------------------------------------------------

FORMAT_1_ARRAYS = (
    "gAMAAAAAAAB7ImZyZWUiOnsiZHR5cGUiOiJJNjQiLCJzaGFwZSI6WzRdLCJkYXRhX29mZnNldHMiOlswLDMyXX0s"
    "ImhlbGRfc2VnbWVudCI6eyJkdHlwZSI6Ikk2NCIsInNoYXBlIjpbMF0sImRhdGFfb2Zmc2V0cyI6WzMyLDMyXX0s"
    "ImtleSI6eyJkdHlwZSI6Ikk2NCIsInNoYXBlIjpbMTZdLCJkYXRhX29mZnNldHMiOlszMiwxNjBdfSwib3JkZXJf"
    "a2V5Ijp7ImR0eXBlIjoiSTY0Iiwic2hhcGUiOlsxNl0sImRhdGFfb2Zmc2V0cyI6WzE2MCwyODhdfSwib3JkZXJf"
    "c2xvdCI6eyJkdHlwZSI6Ikk2NCIsInNoYXBlIjpbMTZdLCJkYXRhX29mZnNldHMiOlsyODgsNDE2XX0sInNlZ21l"
    "bnQiOnsiZHR5cGUiOiJJNjQiLCJzaGFwZSI6WzE2XSwiZGF0YV9vZmZzZXRzIjpbNDE2LDU0NF19LCJwcmlvcml0"
    "eSI6eyJkdHlwZSI6IkY2NCIsInNoYXBlIjpbMTZdLCJkYXRhX29mZnNldHMiOls1NDQsNjcyXX0sImhlbGRfbGVu"
    "Z3RoIjp7ImR0eXBlIjoiSTMyIiwic2hhcGUiOlswXSwiZGF0YV9vZmZzZXRzIjpbNjcyLDY3Ml19LCJoZWxkX3Jv"
    "dyI6eyJkdHlwZSI6IkkzMiIsInNoYXBlIjpbMF0sImRhdGFfb2Zmc2V0cyI6WzY3Miw2NzJdfSwiaGVsZF92ZXJz"
    "aW9uIjp7ImR0eXBlIjoiSTMyIiwic2hhcGUiOlswXSwiZGF0YV9vZmZzZXRzIjpbNjcyLDY3Ml19LCJsZW5ndGgi"
    "OnsiZHR5cGUiOiJJMzIiLCJzaGFwZSI6WzE2XSwiZGF0YV9vZmZzZXRzIjpbNjcyLDczNl19LCJyb3ciOnsiZHR5"
    "cGUiOiJJMzIiLCJzaGFwZSI6WzE2XSwiZGF0YV9vZmZzZXRzIjpbNzM2LDgwMF19LCJ1c2VzIjp7ImR0eXBlIjoi"
    "STMyIiwic2hhcGUiOlsxNl0sImRhdGFfb2Zmc2V0cyI6WzgwMCw4NjRdfSwidmVyc2lvbiI6eyJkdHlwZSI6Ikkz"
    "MiIsInNoYXBlIjpbMTZdLCJkYXRhX29mZnNldHMiOls4NjQsOTI4XX19ICAgIAEAAAAAAAAAAgAAAAAAAAAHAAAA"
    "AAAAAAkAAAAAAAAAAAAANAAAAAD/////////////////////AwAADAAAAAAEAAAQAAAAAAUAABQAAAAABgAAGAAA"
    "AAD//////////wgAACAAAAAA//////////8KAAAoAAAAAAsAACwAAAAADAAASAAAAAANAAA8AAAAAA4AAEAAAAAA"
    "DwAARAAAAAADAAAMAAAAAAQAABAAAAAABQAAFAAAAAAGAAAYAAAAAAcAABwAAAAACAAAIAAAAAAJAAAkAAAAAAoA"
    "ACgAAAAACwAALAAAAAABAAAwAAAAAAAAADQAAAAADAAAOAAAAAANAAA8AAAAAA4AAEAAAAAADwAARAAAAAAMAABI"
    "AAAAAAMAAAAAAAAABAAAAAAAAAAFAAAAAAAAAAYAAAAAAAAABwAAAAAAAAAIAAAAAAAAAAkAAAAAAAAACgAAAAAA"
    "AAALAAAAAAAAAAEAAAAAAAAAAAAAAAAAAAAMAAAAAAAAAA0AAAAAAAAADgAAAAAAAAAPAAAAAAAAAAwAAAAAAAAA"
    "AgAAAAAAAAACAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAQAAAAAAAAABAAAAAAAAAAEA"
    "AAAAAAAAAQAAAAAAAAABAAAAAAAAAAEAAAAAAAAAAwAAAAAAAAACAAAAAAAAAAIAAAAAAAAAAgAAAAAAAAAAAAAA"
    "AADwPwAAAAAAAPA/C3pvDAEA8D8X9N4YAgDgPwAAAAAAAPA/AAAAAAAA8D8GvTeGAAAAQAa9N4YAAARAAAAAAAAA"
    "8D8Lem8MAQD4PwAAAAAAAPA/AAAAAAAA8D8GvTeGAAAMQAAAAAAAAPA/AAAAAAAA8D8AAAAAAADwPwEAAAABAAAA"
    "AQAAAAEAAAABAAAAAQAAAAEAAAABAAAAAQAAAAEAAAABAAAAAQAAAAEAAAABAAAAAQAAAAEAAAABAAAAAAAAAAIA"
    "AAADAAAABAAAAAUAAAAAAAAAAQAAAAIAAAADAAAABAAAAAUAAAAAAAAAAwAAAAQAAAAFAAAAAAAAAAIAAAACAAAA"
    "AQAAAAAAAAAAAAAAAQAAAAMAAAAAAAAAAwAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAQAAAAIAAAACAAAAAAAAAAAA"
    "AAAAAAAAAAAAAAEAAAABAAAAAQAAAAEAAAABAAAAAQAAAAMAAAACAAAAAgAAAAIAAAA="
)
FORMAT_1_RECORD = json.loads(
    '{"job_id": "job-1", "capacity": 16, "table": {"size": 12, "counter": 19}, '
    '"segments": [[0, "job-1/segments/w/00000000.safetensors", 3], [1, '
    '"job-1/segments/w/00000001.safetensors", 4], [2, '
    '"job-1/segments/w/00000002.safetensors", 4], [3, '
    '"job-1/segments/w/00000003.safetensors", 1]], "dead": [], "next_segment_id": 4, '
    '"last_seq": {"w": 3}, "learner_version": 0, "lag_counts": [16, 0, 0, 0, 0, 0, 0,'
    " 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], "
    '"limiter": {"inserted": 19, "sampled": 16}, "sampler": {"max_priority": '
    '3.500001, "batches_drawn": 3}, "counters": {"sample_requests": 2, "evictions": '
    '{"capacity": 2, "max_use": 5, "staleness": 0}, "released_segments": 0}, "rng": '
    '{"bit_generator": "PCG64", "state": {"state": '
    '184632201858030648096050059753392681703, "inc": '
    '222003063171874261427395693950637096479}, "has_uint32": 0, "uinteger": 0}, '
    '"arrays_sha256": '
    '"66c5e9776550f13247e93bb783c6f6beae3a938233f8042a161cc1a2ab540598"}'
)


def test_a_snapshot_of_the_first_format_restores_exactly():
    # Written by the first format's `snapshot` after these same steps: free list and
    # arrival order saved as arrays, segments in the record.
    config = dict(type="prioritized", replay_buffer_size=16, max_use=2)

    def steps(buf):
        for seq in range(3):
            buf.insert([ref(seq, rows=6, version=seq)])
        (batch,) = buf.sample(8, 1, timeout_s=0)
        buf.update_priorities(batch.keys, np.linspace(0.5, 4.0, 8).tolist())
        buf.sample(4, 2, timeout_s=0)
        buf.insert([ref(3, rows=1, version=3)])

    live = make(seed=3, **config)
    steps(live)
    old = make(**config)
    old.restore_snapshot(base64.b64decode("".join(FORMAT_1_ARRAYS)), FORMAT_1_RECORD)
    assert old.stats() == live.stats()
    assert old.table.free_count == live.table.free_count == 4
    for seq in range(4, 8):  # new items take the slots the saved free list names
        for buf in (live, old):
            buf.insert([ref(seq, rows=3, version=seq)])
        # The same items in the same slots (a free slot's key counts differently).
        assert np.array_equal(np.maximum(old.table.key, -1), np.maximum(live.table.key, -1))
        assert old.sample(4, 2, timeout_s=0) == live.sample(4, 2, timeout_s=0)


def test_a_buffer_with_no_segments_restores():
    # a job snapshotted before its first insert, or after every item was evicted
    empty = make(seed=1, replay_buffer_size=100, max_staleness=0, **PER)
    taken = empty.cut()
    assert restored(empty, taken.data, taken.meta).size == 0
    emptied = make(seed=1, replay_buffer_size=100, max_staleness=0, **PER)
    emptied.insert([ref(0, rows=10)])
    emptied.set_learner_version(5)  # every item is now too stale: evicted
    emptied.collect_garbage()
    taken = emptied.cut()
    again = restored(emptied, taken.data, taken.meta)
    assert again.size == emptied.size == 0 and again.stats().live_segments == 0
