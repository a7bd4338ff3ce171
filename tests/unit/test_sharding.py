"""A draw over a job's shards has the distribution of one table: the same items
drawn as often (a chi-square test on every item's count against the single-table
sampler's), with the same importance weights; keys go back to the shard that holds
them, and each shard indexes only its own segments."""

import dataclasses
import math

import numpy as np
import pytest

from common.config import ReplayBufferConfig
from common.errors import ApiError
from common.http_client import ServiceUnavailable
from common.messages import SegmentRef
from services.buffer.client import ShardedData
from services.buffer.core import ReplayBuffer, segment_shard
from services.buffer.sharding import merge, split, split_queue
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


class LocalShard:
    """A shard's data route without HTTP: what services/buffer/host.py does with a
    sample request, on a buffer in this process; `fail` makes it unreachable."""

    def __init__(self, buffer):
        self.buffer = buffer
        self.fail = False

    def sample_items(self, job_id, *, task_id, acknowledge, give_back, items, **request):
        if self.fail:
            raise ServiceUnavailable("connection refused")
        self.buffer.close_holds(task_id, trained=acknowledge or [], untrained=give_back or [])
        return self.buffer.sample_for(
            task_id,
            request["batch_size"],
            request["num_batches"],
            timeout_s=request["timeout_s"],
            items=items,
        )

    def close(self):
        pass


def fifo_shards(shards, segments):
    """A fifo job's `shards` buffers holding `segments` segments, as one client."""
    config = ReplayBufferConfig(
        type="fifo", replay_buffer_size=1000, min_size_to_sample=1, shards=shards
    )
    bufs = [
        ReplayBuffer("job-1", config, DeletedFiles(), error_buffer=0.0, shard=k)
        for k in range(shards)
    ]
    for seq in range(segments):
        bufs[segment_shard(ref(seq).path, shards)].insert([ref(seq)])
    data = ShardedData([f"http://shard-{k}" for k in range(shards)], "c", timeout_s=1.0)
    data.shards = [LocalShard(b) for b in bufs]
    return bufs, data


def draw(data, count, **request):
    """A learn task's draw of `count` items, as one batch."""
    return data.sample(
        "job-1", batch_size=count, num_batches=1, timeout_s=1.0, task_id="learn-1", **request
    )


def places(reply):
    return [(s.path, row) for batch in reply.batches for s in batch.segments for row in s.rows]


def test_split_queue_takes_in_proportion_to_what_each_shard_queues():
    assert split_queue(10, [30, 70]) == [3, 7]
    assert split_queue(10, [5, 5, 5]) == [4, 3, 3]
    assert split_queue(7, [7, 0]) == [7, 0]
    assert split_queue(3, [1, 1, 1]) == [1, 1, 1]
    with pytest.raises(ValueError, match="8 items wanted, 7 queued"):
        split_queue(8, [3, 4])


def test_a_fifo_draw_over_shards_hands_each_item_out_once_and_holds_it_until_acknowledged():
    bufs, data = fifo_shards(2, 20)  # 200 items over 2 shards
    assert all(b.size for b in bufs)
    first = data.sample("job-1", batch_size=50, num_batches=2, timeout_s=1.0, task_id="learn-1")
    second = draw(data, 100, acknowledge=[first.hold_id])
    drawn = places(first) + places(second)
    # Every item once, none twice; the first request's held until acknowledged.
    assert len(drawn) == len(set(drawn)) == 200
    assert first.hold_id.startswith("shards-") and second.hold_id != first.hold_id
    assert sum(b.stats().held_items for b in bufs) == 100
    with pytest.raises(ApiError, match="had not 1 items"):
        data.sample("job-1", batch_size=1, num_batches=1, timeout_s=0.1, task_id="learn-1")
    seq = 20  # one segment more, and a request that acknowledges the second hold
    bufs[segment_shard(ref(seq).path, 2)].insert([ref(seq)])
    third = draw(data, 1, acknowledge=[second.hold_id])
    assert places(third)[0][0] == ref(seq).path
    assert sum(b.stats().held_items for b in bufs) == 1
    assert sum(b.stats().evictions.get("max_use", 0) for b in bufs) == 200


def test_a_fifo_draw_waits_until_the_shards_queue_the_whole_request():
    bufs, data = fifo_shards(2, 4)  # 40 items
    with pytest.raises(ApiError, match="had not 60 items"):
        data.sample("job-1", batch_size=60, num_batches=1, timeout_s=0.2, task_id="learn-1")
    for seq in range(4, 8):
        bufs[segment_shard(ref(seq).path, 2)].insert([ref(seq)])
    reply = data.sample("job-1", batch_size=60, num_batches=1, timeout_s=1.0, task_id="learn-1")
    assert len(places(reply)) == 60

    def seq_of(path):
        return int(path.rsplit("/", 1)[1].split(".")[0])

    # Each shard handed out its oldest: what it still queues is newer than all of it.
    for b in bufs:
        left = {b._segments[s].path for s in b.table.segment[b.table.live_slots()].tolist()}
        taken = {p for p, _ in places(reply) if b.owns(p)}
        assert not left or not taken or min(map(seq_of, left)) >= max(map(seq_of, taken))


def test_a_fifo_draw_that_fails_on_one_shard_gives_the_others_parts_back():
    bufs, data = fifo_shards(2, 20)
    data.sample("job-1", batch_size=1, num_batches=1, timeout_s=1.0, task_id="learn-1")
    data.shards[1].fail = True
    with pytest.raises(ServiceUnavailable):
        data.sample("job-1", batch_size=100, num_batches=1, timeout_s=1.0, task_id="learn-1")
    held = bufs[0].stats().held_items
    assert held > 1  # shard 0 drew its part and holds it for the task
    data.shards[1].fail = False
    reply = data.sample("job-1", batch_size=199, num_batches=1, timeout_s=1.0, task_id="learn-1")
    # Shard 0's part went back before the draw: the job's 199 other items, each once.
    drawn = places(reply)
    assert len(drawn) == len(set(drawn)) == 199
    assert [b.size for b in bufs] == [0, 0]


def test_a_fifo_draw_over_shards_names_its_learn_task():
    """Without a task to hold them for, the parts of shards that drew when another
    failed could be neither held nor given back: such a draw is refused."""
    bufs, data = fifo_shards(2, 20)
    with pytest.raises(ApiError, match="task_id"):
        data.sample("job-1", batch_size=10, num_batches=1, timeout_s=1.0)
    assert sum(b.size for b in bufs) == 200  # nothing drawn
