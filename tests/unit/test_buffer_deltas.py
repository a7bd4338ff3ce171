"""Deltas: a snapshot of what changed since the last one. A cut and the deltas after
it, restored in order, give back exactly the buffer at the last delta; a delta costs
what changed, not the buffer's size."""

import threading

import numpy as np
import pytest

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


def restored_chain(buf, base, deltas, seed=999):
    from services.buffer.core import ReplayBuffer
    from tests.fakes import DeletedFiles

    copy = ReplayBuffer(
        "job-1", buf.config, DeletedFiles(), error_buffer=0.0, seed=seed, release_grace_s=0.0
    )
    copy.restore_snapshot(
        bytes(base.data), base.meta, deltas=[(bytes(d.data), d.meta) for d in deltas]
    )
    return copy


CONFIGS = {
    "prioritized, max_use, staleness": dict(
        replay_buffer_size=300, max_use=4, max_staleness=2, **PER
    ),
    "uniform, lifo": dict(replay_buffer_size=250, type="uniform", eviction="lifo"),
    "fifo queue": dict(replay_buffer_size=300, type="fifo"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_cut_and_its_deltas_restore_to_the_state_at_the_last_delta(name):
    buf = make(seed=3, **CONFIGS[name])
    step = _queue_churn if name == "fifo queue" else churn
    rng = np.random.default_rng(0)
    for seq in range(20):
        step(buf, seq, rng)
    base = buf.cut()
    deltas = []
    for round_ in range(6):
        for seq in range(20 + 15 * round_, 35 + 15 * round_):
            step(buf, seq, rng)
        # The oracle: the whole state, saved at the same instant as the delta.
        deltas.append(buf.delta(lambda: (columns(buf), quiet(buf.stats()), buf.snapshot())))
    at, stats, (data, meta) = deltas[-1].at_cut
    copy = restored_chain(buf, base, deltas)
    whole = restored(buf, data, meta)
    assert_columns_equal(columns(copy), columns(whole))
    assert copy.stats() == whole.stats()
    assert_same_tree(copy, whole)
    if name != "fifo queue":  # (a restored queue gives its held items back as new ones)
        assert_columns_equal(columns(copy), at)
        assert quiet(copy.stats()) == stats
        assert_same_tree(copy, buf)
        # and it goes on as the original does: the same draws from the same state
        drawn = [b.keys for b in copy.sample(4, 2, timeout_s=0)]
        assert drawn == [b.keys for b in buf.sample(4, 2, timeout_s=0)]


def _queue_churn(buf, seq, rng):
    """A fifo queue's life: inserts, and samples held for a task, half acknowledged."""
    buf.insert([ref(seq, rows=5)], force=True)
    if seq % 3 == 0 and buf.size >= 6:
        hold = buf.sample_for("task-1", 3, 2, timeout_s=0).hold_id
        if seq % 2 == 0:
            buf.acknowledge("task-1", [hold])


def test_a_delta_under_load_restores_to_the_state_at_its_cut():
    # Other threads insert (evicting), sample and send priorities while deltas are
    # taken: each delta's chain restores to the state its `at_cut` saw.
    buf = make(seed=5, replay_buffer_size=20_000, **PER)
    for seq in range(100):
        buf.insert([ref(seq, rows=64)], force=True)
    base = buf.cut()
    stop = threading.Event()

    def load(first_seq):
        seq, rng = first_seq, np.random.default_rng(first_seq)
        while not stop.is_set():
            buf.insert([ref(seq, rows=64)], force=True)
            for batch in buf.sample(32, 2, timeout_s=0):
                buf.update_priorities(batch.keys, rng.uniform(0.1, 2.0, 32).tolist())
            seq += 1

    threads = [threading.Thread(target=load, args=(s,)) for s in (1_000, 1_000_000)]
    for t in threads:
        t.start()
    try:
        deltas = [buf.delta(lambda: (columns(buf), quiet(buf.stats()))) for _ in range(5)]
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    for i in range(len(deltas)):
        at, stats = deltas[i].at_cut
        copy = restored_chain(buf, base, deltas[: i + 1])
        assert_columns_equal(columns(copy), at)
        assert quiet(copy.stats()) == stats


def test_a_delta_costs_what_changed_not_the_buffers_size():
    buf = make(replay_buffer_size=1_000_000, **PER)
    for seq in range(200):
        buf.insert([ref(seq, rows=64)], force=True)
    base = buf.cut()
    nothing = buf.delta()
    assert not nothing.meta["changed"] and len(nothing.data) < 4096
    for seq in range(200, 210):  # 640 new items, a few samples and priorities
        buf.insert([ref(seq, rows=64)], force=True)
    for batch in buf.sample(64, 4, timeout_s=0):
        buf.update_priorities(batch.keys, [1.0] * 64)
    small = buf.delta()
    assert small.meta["changed"]
    # about 100 bytes a written item (its slot and value in each column it changed)
    changed_items = 640 + 4 * 64
    assert len(small.data) < 128 * changed_items < len(base.data) / 300, len(small.data)


def test_no_delta_without_a_cut_to_build_on_or_once_the_changes_outgrew_their_room():
    buf = make(replay_buffer_size=1000)
    buf.insert([ref(0, rows=10)], force=True)
    assert buf.delta() is None  # nothing to build on: a cut first
    buf.cut()
    buf.table.max_changes_bytes = 1024
    for seq in range(1, 40):
        buf.insert([ref(seq, rows=10)], force=True)
    assert buf.delta() is None  # too much was changed to keep: a cut instead
    buf.cut()
    buf.insert([ref(40, rows=10)], force=True)
    assert buf.delta() is not None
