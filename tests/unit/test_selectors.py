"""The uniform sampler: no memory per item, uniform over the live items however many
slots are free, and snapshots of the sum-tree sampler it replaced still restore."""

import base64
import json
import tracemalloc

import numpy as np
import pytest

from common.config import ReplayBufferConfig
from common.messages import SegmentRef
from services.buffer.core import ReplayBuffer
from services.buffer.selectors import make_sampler
from services.buffer.table import ItemTable
from tests.fakes import DeletedFiles


def uniform(capacity):
    return make_sampler(ReplayBufferConfig(type="uniform", replay_buffer_size=capacity))


def filled(capacity, sampler):
    table = ItemTable(capacity)
    slots, _ = table.add(capacity)
    sampler.inserted(slots)
    return table


def emptied(table, sampler, slots):
    table.remove(slots)
    sampler.removed(slots)


def chi_square_bound(df, z=4.75):
    """The chi-square quantile at 1 - 1e-6 (Wilson-Hilferty; scipy is not a dependency):
    a uniform sampler with another seed would pass too."""
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


def chi_square(observed, expected):
    return float((((observed - expected) ** 2) / expected).sum())


def assert_uniform_over_live(table, sampler, batch_size, draws_per_item, seed=0):
    live = table.live_slots()
    rng = np.random.default_rng(seed)
    counts = np.zeros(table.capacity, dtype=np.int64)
    for _ in range(-(-len(live) * draws_per_item // batch_size)):
        slots, weights = sampler.sample(batch_size, table, rng)
        assert len(slots) == batch_size and (weights == 1).all()
        counts += np.bincount(slots, minlength=table.capacity)
    assert counts.sum() == counts[live].sum(), "a free slot was drawn"
    assert (counts[live] > 0).all(), "a live item was never drawn"
    per_item = counts[live]
    expected = np.full(len(live), counts.sum() / len(live))
    assert chi_square(per_item, expected) < chi_square_bound(len(live) - 1)
    # A mild lean towards some slots hides in the per-item noise; it shows in the
    # totals of 16 runs of neighbouring live slots.
    runs = np.array_split(np.arange(len(live)), 16)
    observed = np.array([per_item[run].sum() for run in runs])
    assert chi_square(observed, np.array([expected[run].sum() for run in runs])) < (
        chi_square_bound(15)
    )


# --- memory --------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [1_000, 1_000_000])
def test_a_uniform_sampler_allocates_nothing_per_slot(capacity):
    tracemalloc.start()
    try:
        uniform(capacity)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_bytes < 16_384


def test_a_uniform_sampler_in_use_holds_nothing_per_item():
    sampler = uniform(100_000)
    table = filled(100_000, sampler)  # the table's columns: allocated before tracing
    rng = np.random.default_rng(0)
    tracemalloc.start()
    try:
        emptied(table, sampler, np.arange(0, 100_000, 3))
        sampler.sample(512, table, rng)
        sampler.restore(sampler.state(), table)
        sampler.sample(512, table, rng)
        held_bytes, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held_bytes < 16_384


# --- uniform over the live items -------------------------------------------------------


def test_a_full_table_is_sampled_uniformly():
    sampler = uniform(2_000)
    table = filled(2_000, sampler)
    assert_uniform_over_live(table, sampler, batch_size=512, draws_per_item=25)


def test_a_table_with_holes_is_sampled_uniformly_and_never_above_its_live_slots():
    # Rejection: most of the range live. The top fifth is free too, so the range
    # must come down to the highest live slot.
    sampler = uniform(20_000)
    table = filled(20_000, sampler)
    rng = np.random.default_rng(1)
    holes = rng.choice(16_000, size=5_000, replace=False)
    emptied(table, sampler, np.concatenate([holes, np.arange(16_000, 20_000)]))
    assert_uniform_over_live(table, sampler, batch_size=64, draws_per_item=20)


def test_a_sparse_table_is_sampled_uniformly():
    # After many max_use or staleness evictions: 3% of the range live, so a draw
    # lists the live slots instead of rejecting 97% of its candidates.
    sampler = uniform(20_000)
    table = filled(20_000, sampler)
    keep = np.random.default_rng(2).choice(20_000, size=600, replace=False)
    emptied(table, sampler, np.setdiff1d(np.arange(20_000), keep))
    assert_uniform_over_live(table, sampler, batch_size=256, draws_per_item=50)


def test_free_slots_are_taken_again_and_sampled():
    sampler = uniform(1_000)
    table = filled(1_000, sampler)
    emptied(table, sampler, np.arange(1_000))
    with pytest.raises(ValueError, match="empty"):
        sampler.sample(8, table, np.random.default_rng(0))
    slots, _ = table.add(300)
    sampler.inserted(slots)
    assert_uniform_over_live(table, sampler, batch_size=64, draws_per_item=20)


# --- snapshots of the sum-tree sampler ---------------------------------------------------

# A snapshot of a uniform buffer (capacity 16, max_use 2) written while its sampler kept
# two sum trees: 3 segments of 6 items, a request of 8 and their priorities (0.5 to 4),
# a request of 2x4, one more item. 11 items live in 16 slots.
SUM_TREE_ARRAYS = (
    "2AMAAAAAAAB7ImtleSI6eyJkdHlwZSI6Ikk2NCIsInNoYXBlIjpbMTZdLCJkYXRhX29mZnNldHMiOlswLDEy"
    "OF19LCJzZWdtZW50Ijp7ImR0eXBlIjoiSTY0Iiwic2hhcGUiOlsxNl0sImRhdGFfb2Zmc2V0cyI6WzEyOCwy"
    "NTZdfSwicHJpb3JpdHkiOnsiZHR5cGUiOiJGNjQiLCJzaGFwZSI6WzE2XSwiZGF0YV9vZmZzZXRzIjpbMjU2"
    "LDM4NF19LCJyb3ciOnsiZHR5cGUiOiJJMzIiLCJzaGFwZSI6WzE2XSwiZGF0YV9vZmZzZXRzIjpbMzg0LDQ0"
    "OF19LCJsZW5ndGgiOnsiZHR5cGUiOiJJMzIiLCJzaGFwZSI6WzE2XSwiZGF0YV9vZmZzZXRzIjpbNDQ4LDUx"
    "Ml19LCJ2ZXJzaW9uIjp7ImR0eXBlIjoiSTMyIiwic2hhcGUiOlsxNl0sImRhdGFfb2Zmc2V0cyI6WzUxMiw1"
    "NzZdfSwidXNlcyI6eyJkdHlwZSI6IkkzMiIsInNoYXBlIjpbMTZdLCJkYXRhX29mZnNldHMiOls1NzYsNjQw"
    "XX0sImhlbGRfc2VnbWVudCI6eyJkdHlwZSI6Ikk2NCIsInNoYXBlIjpbMF0sImRhdGFfb2Zmc2V0cyI6WzY0"
    "MCw2NDBdfSwic2VnbWVudF9pZHMiOnsiZHR5cGUiOiJJNjQiLCJzaGFwZSI6WzRdLCJkYXRhX29mZnNldHMi"
    "Ols2NDAsNjcyXX0sInNlZ21lbnRfcGF0aF9ieXRlcyI6eyJkdHlwZSI6Ikk2NCIsInNoYXBlIjpbNF0sImRh"
    "dGFfb2Zmc2V0cyI6WzY3Miw3MDRdfSwiZGVhZF9zZWdtZW50cyI6eyJkdHlwZSI6Ikk2NCIsInNoYXBlIjpb"
    "MF0sImRhdGFfb2Zmc2V0cyI6WzcwNCw3MDRdfSwiaGVsZF9yb3ciOnsiZHR5cGUiOiJJMzIiLCJzaGFwZSI6"
    "WzBdLCJkYXRhX29mZnNldHMiOls3MDQsNzA0XX0sImhlbGRfbGVuZ3RoIjp7ImR0eXBlIjoiSTMyIiwic2hh"
    "cGUiOlswXSwiZGF0YV9vZmZzZXRzIjpbNzA0LDcwNF19LCJoZWxkX3ZlcnNpb24iOnsiZHR5cGUiOiJJMzIi"
    "LCJzaGFwZSI6WzBdLCJkYXRhX29mZnNldHMiOls3MDQsNzA0XX0sInNlZ21lbnRfcGF0aHMiOnsiZHR5cGUi"
    "OiJVOCIsInNoYXBlIjpbMTQ4XSwiZGF0YV9vZmZzZXRzIjpbNzA0LDg1Ml19fSAAAAA0AAAAAPz/////////"
    "+/////////8DAAAMAAAAAAQAABAAAAAABQAAFAAAAAD6//////////n/////////CAAAIAAAAAD4////////"
    "/woAACgAAAAACwAALAAAAAAMAABIAAAAAA0AADwAAAAADgAAQAAAAAAPAABEAAAAAAIAAAAAAAAAAgAAAAAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAEAAAAAAAAAAQAAAAAAAAABAAAAAAAAAAEAAAAA"
    "AAAAAQAAAAAAAAABAAAAAAAAAAMAAAAAAAAAAgAAAAAAAAACAAAAAAAAAAIAAAAAAAAAAAAAAAAA8D8AAAAA"
    "AADwPwt6bwwBAPA/F/TeGAIA4D8AAAAAAADwPwAAAAAAAPA/Br03hgAAAEAGvTeGAAAEQAAAAAAAAPA/C3pv"
    "DAEA+D8AAAAAAADwPwAAAAAAAPA/Br03hgAADEAAAAAAAADwPwAAAAAAAPA/AAAAAAAA8D8BAAAAAAAAAAIA"
    "AAADAAAABAAAAAUAAAAAAAAAAQAAAAIAAAADAAAABAAAAAUAAAAAAAAAAwAAAAQAAAAFAAAAAQAAAAEAAAAB"
    "AAAAAQAAAAEAAAABAAAAAQAAAAEAAAABAAAAAQAAAAEAAAABAAAAAQAAAAEAAAABAAAAAQAAAAIAAAACAAAA"
    "AAAAAAAAAAAAAAAAAAAAAAEAAAABAAAAAQAAAAEAAAABAAAAAQAAAAMAAAACAAAAAgAAAAIAAAAAAAAAAgAA"
    "AAIAAAABAAAAAAAAAAAAAAACAAAAAgAAAAEAAAACAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAABAAAAAAAAAAAA"
    "AAABAAAAAAAAAAIAAAAAAAAAAwAAAAAAAAAlAAAAAAAAACUAAAAAAAAAJQAAAAAAAAAlAAAAAAAAAGpvYi0x"
    "L3NlZ21lbnRzL3cvMDAwMDAwMDAuc2FmZXRlbnNvcnNqb2ItMS9zZWdtZW50cy93LzAwMDAwMDAxLnNhZmV0"
    "ZW5zb3Jzam9iLTEvc2VnbWVudHMvdy8wMDAwMDAwMi5zYWZldGVuc29yc2pvYi0xL3NlZ21lbnRzL3cvMDAw"
    "MDAwMDMuc2FmZXRlbnNvcnM="
)
SUM_TREE_RECORD = json.loads(
    '{"format": 2, "job_id": "job-1", "capacity": 16, "table": {"size": 11, '
    '"counter": 19, "freed": 8}, "next_segment_id": 4, "last_seq": {"w": 3}, '
    '"learner_version": 0, "lag_counts": [16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, '
    '0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], "limiter": '
    '{"inserted": 19, "sampled": 16}, "sampler": {"max_priority": 3.500001, '
    '"batches_drawn": 3}, "counters": {"sample_requests": 2, "evictions": '
    '{"capacity": 2, "max_use": 6, "staleness": 0}, "released_segments": 0}, "rng": '
    '{"bit_generator": "PCG64", "state": {"state": '
    '184632201858030648096050059753392681703, "inc": '
    '222003063171874261427395693950637096479}, "has_uint32": 0, "uinteger": 0}, '
    '"inserted_env_steps": 19, "arrays_sha256": '
    '"8609bcc8b885bd52a5be8c5746f436dbd205c7bd9786b7a7fcc8d87fb1ea5b70"}'
)


def buffer(seed=0):
    config = ReplayBufferConfig(
        type="uniform", replay_buffer_size=16, max_use=2, min_size_to_sample=1
    )
    return ReplayBuffer(
        "job-1", config, DeletedFiles(), error_buffer=0.0, seed=seed, release_grace_s=0.0
    )


def test_a_snapshot_of_the_sum_tree_sampler_restores():
    buf = buffer()
    buf.restore_snapshot(base64.b64decode(SUM_TREE_ARRAYS), SUM_TREE_RECORD)
    assert buf.size == 11 and buf.table.free_count == 5
    assert buf.sampler.state() == {"max_priority": 3.500001, "batches_drawn": 3}
    live_keys = set(buf.table.key[buf.table.key >= 0].tolist())
    (batch,) = buf.sample(4, 1, timeout_s=0)
    assert set(batch.keys) <= live_keys
    # A new item takes the highest priority the learner sent before the snapshot.
    path = "job-1/segments/w/00000004.safetensors"
    buf.insert([SegmentRef(path=path, rows=1, env_steps=1, policy_version=4)])
    newest = int(np.argmax(buf.table.key))
    assert buf.table.priority[newest] == 3.500001
    # Snapshots it writes restore to the same draws.
    data, meta = buf.snapshot()
    assert meta["sampler"] == {"max_priority": 3.500001, "batches_drawn": 4}
    copy = buffer(seed=9)
    copy.restore_snapshot(bytes(data), meta)
    for _ in range(3):
        assert copy.sample(3, 1, timeout_s=0) == buf.sample(3, 1, timeout_s=0)
