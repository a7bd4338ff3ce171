"""A draw over a job's shards has the distribution of one table: the same items
drawn as often (a chi-square test on every item's count against the single-table
sampler's), with the same importance weights; keys go back to the shard that holds
them, and each shard indexes only its own segments."""

import dataclasses
import math

import numpy as np
import pytest

from common.config import ReplayBufferConfig
from common.messages import SegmentRef
from services.buffer.core import ReplayBuffer, segment_shard
from services.buffer.sharding import merge, split
from services.buffer.table import shard_of
from tests.fakes import DeletedFiles

SEGMENTS, ROWS = 24, 10


def ref(seq):
    """Segment `seq`, of a collect task's folder of its own (a shard holds folders)."""
    return SegmentRef(
        path=f"job-1/segments/w.collect-{seq}/{seq:08d}.safetensors",
        rows=ROWS,
        env_steps=ROWS,
        policy_version=0,
    )


def priority_of(path, row):
    """A fixed priority per item, spread over two orders of magnitude."""
    seq = int(path.rsplit("/", 1)[1].split(".")[0])
    return 0.05 + ((seq * ROWS + row) * 37 % 101) / 20


def buffers(kind, shards, seed):
    config = ReplayBufferConfig(
        type=kind,
        replay_buffer_size=1000,
        min_size_to_sample=1,
        beta=0.5,
        beta_anneal_steps=0,
        shards=shards,
    )
    made = [
        ReplayBuffer("job-1", config, DeletedFiles(), error_buffer=0.0, seed=seed + k, shard=k)
        for k in range(shards)
    ]
    for seq in range(SEGMENTS):
        made[segment_shard(ref(seq).path, shards)].insert([ref(seq)])
    if kind == "prioritized":
        for buf in made:
            # Every live item's priority, by its place (its key differs per layout).
            live = buf.table.live_slots()
            paths = [buf._segments[s].path for s in buf.table.segment[live].tolist()]
            rows = buf.table.row[live].tolist()
            values = [priority_of(p, r) for p, r in zip(paths, rows, strict=True)]
            buf.update_priorities(buf.table.key[live].tolist(), values)
    return made


def draw_places(bufs, rounds, batch_size, rng, *, by_mass=True):
    """(path, row) -> [times drawn, weight] over `rounds` requests."""
    seen = {}
    for _ in range(rounds):
        if len(bufs) == 1:
            parts = [bufs[0].sample_for(None, batch_size, 4, timeout_s=0)]
            items = parts[0]
        else:
            masses = [b.sampler.mass(b.table) for b in bufs] if by_mass else [1] * len(bufs)
            counts = split(batch_size * 4, masses, rng)
            parts = [
                b.sample_for(None, batch_size, 4, timeout_s=0, items=c)
                for b, c in zip(bufs, counts, strict=True)
                if c
            ]
            mins = [b.sampler.weight_scale()[0] if b.size else math.inf for b in bufs]
            items = merge(parts, batch_size=batch_size, rng=rng, min_weights=mins)
        for key_path, row, weight in zip(
            (items.paths[i] for i in items.segment.tolist()),
            items.rows.tolist(),
            items.weights.tolist(),
            strict=True,
        ):
            entry = seen.setdefault((key_path, row), [0, weight])
            entry[0] += 1
            assert abs(entry[1] - weight) <= 1e-5 * weight, (key_path, row)
    return seen


def chi_square_p(counts_a, counts_b):
    """p-value of a two-sample chi-square test of equal distributions (2 x K table),
    by the Wilson-Hilferty approximation of the chi-square tail (no scipy here)."""
    table = np.array([counts_a, counts_b], dtype=np.float64)
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    stat = float(((table - expected) ** 2 / expected).sum())
    df = table.shape[1] - 1
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
@pytest.mark.parametrize("shards", [2, 3])
def test_a_draw_over_shards_has_the_distribution_of_one_table(kind, shards):
    rng = np.random.default_rng(7)
    one = draw_places(buffers(kind, 1, seed=1), 300, 64, rng)
    many = draw_places(buffers(kind, shards, seed=2), 300, 64, rng)
    places = sorted(one)
    assert sorted(many) == places  # every item drawn on both sides
    p = chi_square_p([one[x][0] for x in places], [many[x][0] for x in places])
    assert p > 1e-3, p
    # The same importance weight for each item: normalized over all the shards.
    for place in places:
        assert many[place][1] == pytest.approx(one[place][1], rel=1e-5)


def test_the_test_sees_a_split_that_ignores_the_masses():
    """An equal split over shards of unequal mass is not one table's draw: the test
    above must be able to fail."""
    rng = np.random.default_rng(7)
    skewed = buffers("prioritized", 2, seed=2)
    # Shard 1's items far likelier than before: its mass is no longer about half.
    live = skewed[1].table.live_slots()
    skewed[1].update_priorities(skewed[1].table.key[live].tolist(), [400.0] * len(live))
    reference = buffers("prioritized", 1, seed=1)
    live = reference[0].table.live_slots()
    keys = reference[0].table.key[live]
    paths = [reference[0]._segments[s].path for s in reference[0].table.segment[live].tolist()]
    odd = [segment_shard(p, 2) == 1 for p in paths]
    reference[0].update_priorities(keys[np.array(odd)].tolist(), [400.0] * sum(odd))
    one = draw_places(reference, 300, 64, rng)
    right = draw_places(skewed, 300, 64, rng)
    wrong = draw_places(skewed, 300, 64, rng, by_mass=False)
    places = sorted(one)
    assert chi_square_p([one[x][0] for x in places], [right[x][0] for x in places]) > 1e-3
    assert chi_square_p([one[x][0] for x in places], [wrong.get(x, [0])[0] for x in places]) < 1e-6


def test_keys_name_their_shard_and_shards_index_only_their_segments():
    bufs = buffers("uniform", 3, seed=0)
    for k, buf in enumerate(bufs):
        keys = buf.table.key[buf.table.live_slots()]
        assert (shard_of(keys, 3) == k).all()
        assert buf.size and all(segment_shard(s.path, 3) == k for s in buf._segments.values())
    new = next(ref(seq) for seq in range(SEGMENTS, 99) if segment_shard(ref(seq).path, 3) == 1)
    with pytest.raises(ValueError, match="belongs to shard 1 of 3"):
        bufs[0].insert([new])
    assert bufs[1].owns(new.path) and not bufs[0].owns(new.path)
    # A collector's segments go to one shard in runs, and to every shard in turn.
    folder = [f"job-1/segments/w.collect-5/{seq:08d}.safetensors" for seq in range(48)]
    shards = [segment_shard(path, 3) for path in folder]
    assert len(set(shards[:16])) == 1 and sorted(set(shards)) == [0, 1, 2]
    # Priorities sent to a shard for another's keys change nothing there.
    other = bufs[1].table.key[bufs[1].table.live_slots()][:3].tolist()
    assert bufs[0].update_priorities(other, [5.0] * 3) == 0


def test_a_shards_part_counts_the_whole_draws_batches():
    """`items` draws that many, as one batch, and anneals beta by the request's
    batches, as one table does."""
    config = ReplayBufferConfig(
        type="prioritized",
        replay_buffer_size=100,
        min_size_to_sample=1,
        shards=2,
        beta_anneal_steps=100,
    )
    one = next(ref(seq) for seq in range(99) if segment_shard(ref(seq).path, 2) == 1)
    buf = ReplayBuffer("job-1", config, DeletedFiles(), error_buffer=0.0, shard=1)
    buf.insert([one])
    items = buf.sample_for(None, 64, 8, timeout_s=0, items=37)
    assert len(items.keys) == 37 and items.batch_size == 37
    assert buf.sampler.batches_drawn == 8 and buf.stats().samples == 37
    assert items.shard is not None and items.shard.mass == pytest.approx(buf.sampler.tree.total)
    assert dataclasses.replace(items.shard).beta == pytest.approx(0.4)


def test_each_shards_rate_limiter_keeps_the_jobs_ratio():
    """Shard 0's items are drawn less than its share: counted alone, its limiter would
    hold its collectors back; counting the other shard's items too (as the coordinator
    relays them), it lets them insert while the job's ratio holds, and holds the
    learner back once the job's sampling is ahead."""
    config = ReplayBufferConfig(
        replay_buffer_size=1000, min_size_to_sample=10, samples_per_insert=2.0, shards=2
    )
    shards = [
        ReplayBuffer("job-1", config, DeletedFiles(), error_buffer=20.0, shard=k) for k in (0, 1)
    ]
    refs = {k: [ref(s) for s in range(99) if segment_shard(ref(s).path, 2) == k] for k in (0, 1)}

    def relay():
        for k, shard in enumerate(shards):
            other = shards[1 - k].limiter
            shard.set_elsewhere(other.inserted, other.sampled)

    for k in (0, 1):
        shards[k].insert(refs[k][:2])  # 20 items each, 40 in all
    relay()
    shards[1].sample_for(None, 1, 1, timeout_s=0, items=60)  # the job's 2 x (40 - 10)
    # Before it hears of those samples, shard 0 (its own 20 in, 0 out) holds its
    # collectors back, as it would counting alone.
    assert not shards[0].limiter.can_insert(10)
    relay()
    # The job: 40 in, 60 out, on its ratio: shard 0 may take 10 more.
    assert shards[0].limiter.can_insert(10)
    shards[0].sample_for(None, 1, 1, timeout_s=0, items=20)
    relay()
    # 80 sampled of 40: the job's learner is ahead by the error buffer: it waits, anywhere.
    assert not any(s.limiter.can_sample(1) for s in shards)
    assert all(s.limiter.can_insert(10) for s in shards)
