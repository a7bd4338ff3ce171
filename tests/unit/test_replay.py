"""Samplers, removers, item kinds, use and staleness limits, GC and persistence."""

import numpy as np
import pytest

from common.config import ReplayBufferConfig
from common.messages import SegmentRef
from common.storage import SharedStore
from services.buffer.core import ReplayBuffer, SampleTimeout
from services.buffer.sumtree import SumTree
from tests.fakes import DeletedFiles

# chi2.ppf(0.999, df) for the degrees of freedom used below (scipy is not a dependency)
CHI2_999 = {18: 42.31, 49: 85.35}


def ref(seq, rows=10, version=0, episodes=(), worker="w"):
    return SegmentRef(
        path=f"job-1/segments/{worker}/{seq:08d}.safetensors",
        rows=rows,
        env_steps=rows,
        policy_version=version,
        episodes=list(episodes),
    )


def make(files=None, *, error_buffer=0.0, seed=0, **config):
    config.setdefault("min_size_to_sample", 1)
    cfg = ReplayBufferConfig(**config)
    return ReplayBuffer(
        "job-1",
        cfg,
        files or DeletedFiles(),
        error_buffer=error_buffer,
        seed=seed,
        release_grace_s=0.0,
    )


def items(batch):
    """(key, path, row, length) per item, in message order."""
    out = []
    for seg in batch.segments:
        lengths = seg.lengths or [1] * len(seg.rows)
        out += [(seg.path, r, n) for r, n in zip(seg.rows, lengths, strict=True)]
    return [(k, *rest) for k, rest in zip(batch.keys, out, strict=True)]


def chi_square(counts, expected):
    return float((((counts - expected) ** 2) / expected).sum())


# --- sum tree ------------------------------------------------------------------------


def test_sum_tree_totals_minimum_and_frequencies():
    tree = SumTree(20)
    weights = np.arange(1, 21, dtype=np.float64)
    tree.update(np.arange(20), weights)
    assert tree.total == pytest.approx(weights.sum()) and tree.min == 1.0
    tree.update(np.array([0, 0]), np.array([5.0, 0.0]))  # the last write wins
    assert tree.min == 2.0
    draws = tree.sample(1_000_000, np.random.default_rng(0))
    counts = np.bincount(draws, minlength=20)
    assert counts[0] == 0  # an emptied leaf is never drawn
    expected = 1_000_000 * weights[1:] / weights[1:].sum()
    assert chi_square(counts[1:], expected) < CHI2_999[18]


@pytest.mark.parametrize("capacity", [1, 2, 1000, 4099])
def test_sum_tree_runs_of_leaves_match_a_rebuild(capacity):
    """An update of consecutive leaves (an insert's) takes its own path; mixed with
    scattered updates, every node must equal a tree rebuilt from the leaves."""
    rng = np.random.default_rng(capacity)
    tree = SumTree(capacity)
    for _ in range(300):
        if rng.random() < 0.5:
            n = int(rng.integers(1, min(200, capacity) + 1))
            first = int(rng.integers(0, capacity - n + 1))
            index = np.arange(first, first + n)
        else:
            index = rng.integers(0, capacity, int(rng.integers(1, 300)))
        tree.update(index, rng.random(len(index)) * (rng.random(len(index)) > 0.2))
    fresh = SumTree(capacity)
    fresh.rebuild(tree.leaves())
    np.testing.assert_allclose(tree._sum, fresh._sum, rtol=1e-12)
    np.testing.assert_array_equal(tree._min, fresh._min)


# --- prioritized replay -----------------------------------------------------------------


def test_per_sampling_frequencies_follow_priority_to_the_alpha():
    alpha = 0.6
    buf = make(type="prioritized", replay_buffer_size=100, alpha=alpha, beta=0.4, priority_eps=1e-9)
    for seq in range(5):
        buf.insert([ref(seq)])  # 50 items
    keys = buf.sample(50, 1, timeout_s=0)[0].keys
    all_keys = np.array(sorted(set(keys) | set(buf.table.key[buf.table.key >= 0].tolist())))
    priorities = np.random.default_rng(1).uniform(0.1, 10.0, size=len(all_keys))
    assert buf.update_priorities(all_keys.tolist(), priorities.tolist()) == 50
    counts = dict.fromkeys(all_keys.tolist(), 0)
    draws = 3200
    for batch in buf.sample(32, draws, timeout_s=0):
        for key in batch.keys:
            counts[key] += 1
    observed = np.array([counts[k] for k in all_keys.tolist()])
    expected = draws * 32 * priorities**alpha / (priorities**alpha).sum()
    assert chi_square(observed, expected) < CHI2_999[49]


def test_importance_weights_and_beta_annealing():
    buf = make(
        type="prioritized",
        replay_buffer_size=100,
        alpha=1.0,
        beta=0.5,
        beta_anneal_steps=10,
        priority_eps=1e-9,
    )
    buf.insert([ref(0, rows=4)])
    keys = sorted(buf.table.key[buf.table.key >= 0].tolist())
    buf.update_priorities(keys, [1.0, 2.0, 4.0, 8.0])
    priority = dict(zip(keys, [1.0, 2.0, 4.0, 8.0], strict=True))
    (batch,) = buf.sample(4, 1, timeout_s=0)  # no batch drawn before it: beta = 0.5
    beta = 0.5
    for key, weight in zip(batch.keys, batch.weights, strict=True):
        assert weight == pytest.approx((priority[key] / 1.0) ** -beta, rel=1e-5)
    assert max(batch.weights) <= 1.0
    buf.sample(4, 4, timeout_s=0)  # 5 batches drawn: halfway
    assert buf.sampler.beta == pytest.approx(0.75)
    buf.sample(4, 20, timeout_s=0)
    assert buf.sampler.beta == 1.0  # annealed


def test_new_items_get_the_highest_priority_and_evicted_keys_are_ignored():
    buf = make(type="prioritized", replay_buffer_size=10, priority_eps=1e-9)
    buf.insert([ref(0)])
    old_keys = buf.table.key.tolist()
    buf.update_priorities(old_keys[:2], [7.0, 0.5])
    buf.insert([ref(1, rows=5)])  # evicts the 5 oldest (FIFO)
    new_slots = buf.table.slots_of(np.array(buf.table.key[:5]))[0]
    assert np.allclose(buf.table.priority[new_slots], 7.0)
    assert buf.update_priorities(old_keys, [1.0] * 10) == 5  # 5 of them were evicted


# --- queue, removers --------------------------------------------------------------------


def test_fifo_sampler_serves_each_item_once_in_order():
    buf = make(type="fifo", replay_buffer_size=100)
    for seq in range(3):
        buf.insert([ref(seq)])
    first, second = buf.sample(10, 2, timeout_s=0)
    assert [(p, r) for _, p, r, _ in items(first)] == [
        ("job-1/segments/w/00000000.safetensors", r) for r in range(10)
    ]
    assert {p for _, p, _, _ in items(second)} == {"job-1/segments/w/00000001.safetensors"}
    assert buf.size == 10
    with pytest.raises(SampleTimeout):
        buf.sample(10, 2, timeout_s=0)  # a queue never repeats an item
    assert buf.stats().use_count_max == 0 and buf.stats().size == 10


def test_lifo_eviction_drops_the_newest():
    files = DeletedFiles()
    buf = make(files, replay_buffer_size=20, eviction="lifo")
    buf.insert([ref(0)])
    buf.insert([ref(1)])
    buf.insert([ref(2)])
    paths = {p for b in buf.sample(20, 5, timeout_s=0) for _, p, _, _ in items(b)}
    assert paths == {
        "job-1/segments/w/00000000.safetensors",
        "job-1/segments/w/00000002.safetensors",
    }
    assert files.deleted == ["job-1/segments/w/00000001.safetensors"]


def test_uniform_eviction_keeps_capacity_and_counts():
    buf = make(replay_buffer_size=30, eviction="uniform")
    for seq in range(10):
        buf.insert([ref(seq)])
    stats = buf.stats()
    assert stats.size == 30 and stats.evictions["capacity"] == 70
    # every newest item survives its own insert
    newest = {p for b in buf.sample(30, 20, timeout_s=0) for _, p, _, _ in items(b)}
    assert "job-1/segments/w/00000009.safetensors" in newest


# --- item kinds ------------------------------------------------------------------------


def test_episode_subsequences_never_cross_episodes():
    buf = make(replay_buffer_size=50, item="episode", sequence_length=4)
    episodes = [(0, 5), (5, 12), (17, 3)]
    buf.insert([ref(0, rows=20, episodes=episodes)])
    buf.insert([ref(1, rows=6, episodes=[(0, 6)])])
    assert buf.size == 4  # whole episodes are the items
    seen = set()
    for batch in buf.sample(4, 400, timeout_s=0):
        for _, path, row, length in items(batch):
            spans = episodes if path.endswith("00000000.safetensors") else [(0, 6)]
            start, n = next((s, n) for s, n in spans if s <= row < s + n)
            assert row + length <= start + n, (row, length, start, n)
            assert length == min(4, n)
            seen.add((path[-5:], row))
    assert len(seen) > 8  # offsets vary inside episodes


@pytest.mark.parametrize(
    ("episodes", "words"),
    [((), "needs the segment's episodes"), ([(0, 8), (5, 5)], "overlap"), ([(8, 5)], "runs past")],
)
def test_bad_episode_layouts_are_refused(episodes, words):
    buf = make(item="episode", sequence_length=2)
    with pytest.raises(ValueError, match=words):
        buf.insert([ref(0, rows=10, episodes=episodes)])
    assert buf.size == 0


# --- use and staleness -----------------------------------------------------------------


def test_max_use_retires_items():
    buf = make(replay_buffer_size=100, max_use=2)
    buf.insert([ref(0)])
    uses = {}
    for _ in range(30):
        try:
            (batch,) = buf.sample(3, 1, timeout_s=0)
        except SampleTimeout:
            break
        # A request draws with replacement, so one may take an item more than once;
        # an item used up by earlier requests is never drawn again.
        assert all(uses.get(key, 0) < 2 for key in batch.keys)
        for key in batch.keys:
            uses[key] = uses.get(key, 0) + 1
    assert buf.size < 3 and buf.stats().evictions["max_use"] >= 8


def test_max_staleness_evicts_and_never_samples_stale_items():
    files = DeletedFiles()
    buf = make(files, replay_buffer_size=100, max_staleness=1)
    for seq, version in enumerate([0, 1, 2]):
        buf.insert([ref(seq, version=version)])
    assert buf.set_learner_version(3) == 20  # versions 0 and 1 are > 1 behind
    paths = {p for b in buf.sample(10, 20, timeout_s=0) for _, p, _, _ in items(b)}
    assert paths == {"job-1/segments/w/00000002.safetensors"}
    buf.insert([ref(3, version=0)])  # arrives stale: indexed, then evicted at once
    assert buf.size == 10 and buf.stats().evictions["staleness"] == 30
    assert len(files.deleted) == 3
    assert buf.stats().staleness_max == 1


# --- lifecycle ------------------------------------------------------------------------


def test_gc_deletes_exactly_the_fully_evicted_segments():
    files = DeletedFiles()
    buf = make(files, replay_buffer_size=25)
    for seq in range(5):
        buf.insert([ref(seq)])  # 50 items through 25 slots: 0, 1 gone, 2 half
    assert sorted(files.deleted) == [
        "job-1/segments/w/00000000.safetensors",
        "job-1/segments/w/00000001.safetensors",
    ]
    buf.release_all()
    assert len(files.deleted) == 5 and buf.stats().live_segments == 0


def test_save_and_restore_give_identical_samples(tmp_path):
    store = SharedStore(tmp_path)
    config = dict(type="prioritized", replay_buffer_size=64, max_use=5, max_staleness=3)
    buf = make(store, seed=7, **config)
    for seq in range(9):
        buf.insert([ref(seq, version=seq // 2)])
    buf.set_learner_version(4)
    (batch,) = buf.sample(16, 1, timeout_s=0)
    buf.update_priorities(batch.keys, np.linspace(0.1, 3.0, 16).tolist())
    buf.save(store, "job-1/coordinator/buffer")

    copy = make(store, seed=999, **config)
    copy.restore(store, "job-1/coordinator/buffer")
    assert copy.stats() == buf.stats()
    assert copy.sample(8, 4, timeout_s=0) == buf.sample(8, 4, timeout_s=0)
    copy.insert([ref(8)])  # a re-sent segment is still a duplicate after restore
    assert copy.insert([ref(8)]).duplicates == 1
    buf.insert([ref(9)])
    copy.insert([ref(9)])
    assert copy.sample(8, 2, timeout_s=0) == buf.sample(8, 2, timeout_s=0)


def test_restore_refuses_mismatched_files(tmp_path):
    store = SharedStore(tmp_path)
    buf = make(store, replay_buffer_size=10)
    buf.insert([ref(0)])
    buf.save(store, "job-1/b")
    with pytest.raises(ValueError, match="another buffer"):
        make(store, replay_buffer_size=11).restore(store, "job-1/b")
    store.write_bytes("job-1/b.safetensors", store.read_bytes("job-1/b.safetensors")[:-1] + b"x")
    with pytest.raises(ValueError, match="do not match"):
        make(store, replay_buffer_size=10).restore(store, "job-1/b")


def test_sampled_lag_histogram():
    buf = make(replay_buffer_size=100)
    buf.insert([ref(0, version=0)])
    buf.insert([ref(1, version=2)])
    buf.set_learner_version(3)
    buf.sample(10, 20, timeout_s=0)
    histogram = buf.stats().sampled_lag_histogram
    assert sum(histogram) == 200
    assert histogram[1] > 0 and histogram[3] > 0  # lag 1 (version 2) and 3 (version 0)
    assert histogram[0] == histogram[2] == 0


# --- items held for a learner's task ------------------------------------------------------


def test_fifo_items_held_for_a_task_come_back_when_it_ends_without_training():
    files = DeletedFiles()
    buf = make(files, type="fifo", replay_buffer_size=100)
    for seq in range(2):
        buf.insert([ref(seq)])
    drawn = buf.sample_for("learn-1", 10, 1, timeout_s=0)
    batches, hold = drawn.reply().batches, drawn.hold_id
    assert hold is not None and buf.size == 10 and buf.stats().held_items == 10
    taken = {(p, r) for _, p, r, _ in items(batches[0])}
    assert files.deleted == []  # a held item keeps its segment's file
    assert buf.give_back("learn-1") == 10
    assert buf.size == 20 and buf.stats().held_items == 0
    again = {(p, r) for b in buf.sample(10, 2, timeout_s=0) for _, p, r, _ in items(b)}
    assert taken <= again  # the learner that takes over trains on them


def test_acknowledged_holds_leave_for_good_and_release_their_segments():
    files = DeletedFiles()
    buf = make(files, type="fifo", replay_buffer_size=100)
    buf.insert([ref(0)])
    hold = buf.sample_for("learn-1", 10, 1, timeout_s=0).hold_id
    assert buf.acknowledge("learn-2", [hold]) == 0  # another task's ack is ignored
    assert buf.acknowledge("learn-1", [hold]) == 10
    assert buf.acknowledge("learn-1", [hold]) == 0  # said twice: counted once
    assert buf.give_back("learn-1") == 0 and buf.size == 0
    assert files.deleted == ["job-1/segments/w/00000000.safetensors"]


def test_held_items_survive_a_snapshot_as_items_to_train_on(tmp_path):
    store = SharedStore(tmp_path)
    buf = make(store, type="fifo", replay_buffer_size=100)
    buf.insert([ref(0)])
    buf.sample_for("learn-1", 4, 1, timeout_s=0)
    buf.save(store, "job-1/b")
    copy = make(store, type="fifo", replay_buffer_size=100)
    copy.restore(store, "job-1/b")
    assert copy.size == 10 and copy.stats().held_items == 0  # nobody holds them now


def test_non_consuming_samplers_hold_nothing():
    buf = make(type="uniform", replay_buffer_size=100)
    buf.insert([ref(0)])
    hold = buf.sample_for("learn-1", 4, 1, timeout_s=0).hold_id
    assert hold is None and buf.size == 10


def test_stats_of_a_large_buffer_are_estimated_from_a_sample_quickly():
    from services.buffer.core import STATS_SAMPLE

    rows = 50_000
    buf = make(replay_buffer_size=4 * STATS_SAMPLE)
    for seq in range(5):  # 250,000 items, versions 0..4
        buf.insert([ref(seq, rows=rows, version=seq)])
    buf.set_learner_version(4)
    stats = buf.stats()
    assert stats.size == 5 * rows  # counters stay exact
    assert stats.staleness_mean == pytest.approx(2.0, abs=0.05)  # exact: 2.0
    assert stats.staleness_max == 4
