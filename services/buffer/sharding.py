"""One draw over a job's shards with the distribution of one table.

A job with `replay_buffer.shards: n` has n buffer processes; a collector's segments
go to one of them in runs of 16, then to the next (`core.segment_shard`: an insert
mostly goes to one shard, as it would to one buffer, and every shard gets its share),
and each numbers its items so that a key tells its shard (`table.shard_of`). A learner's draw of
`count` items goes to every shard at once:

1. `split`: how many of the items each shard draws, multinomial in the shards'
   masses (the sum of their items' sampling weights: priority^alpha, or 1 an item).
   An item of shard k is then drawn with probability mass_k / total x
   weight_i / mass_k = weight_i / total, as from one table of all the items.
2. each shard draws its part (`SampleRequest.items`) and says what its importance
   weights were normalized by (`ShardState`);
3. `merge`: the parts, renormalized by the smallest weight of all shards
   ((weight_i / min)^-beta, as one table's are), shuffled (a draw with replacement
   is exchangeable: where an item lands in the request does not matter) and cut into
   batches, each grouped by segment as one buffer's reply is.

The masses a split uses are those each shard reported with its last answer: one
request behind, the price of asking every shard once a round instead of twice.

A consuming (fifo) buffer hands each item out once, oldest first: a draw over its
shards waits until they queue the request's items between them (asking for their
state), then takes from each in proportion to what it queues (`split_queue`), each
shard its oldest, held for the learn task. The client names the parts' holds with
one id of its own (acknowledging it acknowledges each shard's); parts drawn when
another shard failed go back to their queues with the next request (`give_back`).
A shard's `max_use`, staleness and policy-lag counts are its own, and add up to the
job's (`merge_stats`). Its rate limiter keeps the job's ratio: it counts the other
shards' items inserted and sampled too, as the coordinator relays them from their
reports (limiter.py); counted per shard, a shard whose items are drawn less than its
share of the inserts would hold its collectors back while the job's ratio is met.

Usage::

    counts = split(1024, [s.mass for s in states], rng)
    parts = [shard.sample(items=c) for shard, c in zip(shards, counts) if c]
    items = merge(parts, batch_size=64, rng=rng, min_weights=[...])
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from common.array_bodies import SampledItems, batch_then_segment
from common.config import ReplayBufferConfig
from common.messages import BufferStats


def shard_config(config: ReplayBufferConfig) -> ReplayBufferConfig:
    """What one of `config.shards` shards holds: its share of the capacity (its rate
    limiter counts the job's items, `min_size_to_sample` included: limiter.py)."""
    shards = config.shards
    if shards == 1:
        return config
    return dataclasses.replace(config, replay_buffer_size=-(-config.replay_buffer_size // shards))


def split(count: int, masses: list[float], rng: np.random.Generator) -> list[int]:
    """How many of `count` draws each shard makes: multinomial in `masses` (equal
    shares while no shard has said its mass)."""
    mass = np.asarray(masses, dtype=np.float64)
    total = mass.sum()
    if not total > 0:
        mass, total = np.ones(len(masses)), float(len(masses))
    return rng.multinomial(count, mass / total).tolist()


def split_queue(count: int, sizes: list[float]) -> list[int]:
    """How many of `count` items each consuming (fifo) shard hands out, given how many
    each queues (`sizes`, at least `count` in all): in proportion to them, each its
    oldest. A job's collectors send their segments to every shard in turn, so each
    shard's queue spans about the same stretch of time, and the items taken are the
    job's oldest to within a run of segments."""
    queued = np.asarray(sizes, dtype=np.float64)
    total = queued.sum()
    if count > total:
        raise ValueError(f"{count} items wanted, {total:.0f} queued")
    exact = count * queued / total
    counts = np.floor(exact).astype(np.int64)
    # The rest, one each, to the largest remainders (a shard whose share is whole
    # has no remainder, so none is given more than it queues).
    rest = count - int(counts.sum())
    counts[np.argsort(counts - exact, kind="stable")[:rest]] += 1
    return counts.tolist()


def merge(
    parts: list[SampledItems],
    *,
    batch_size: int,
    rng: np.random.Generator,
    min_weights: list[float] | None = None,
) -> SampledItems:
    """The shards' parts of one draw as one shuffled sample in batches of
    `batch_size`.

    Args:
        min_weights: the smallest sampling weight of every shard of the job, as last
            reported, those that drew nothing this time included; None: those of the
            parts.
    """
    parts = [p for p in parts if len(p.keys)]
    if not parts:
        return SampledItems.empty()
    smallest = min(min_weights if min_weights else [p.shard.min_weight for p in parts if p.shard])
    keys, weights, segment, rows, lengths, paths = [], [], [], [], [], []
    for part in parts:
        scale = 1.0
        if part.shard is not None and part.shard.beta > 0:
            # (w / min_k)^-beta x (min / min_k)^beta = (w / min)^-beta.
            scale = (smallest / part.shard.min_weight) ** part.shard.beta
        keys.append(part.keys)
        weights.append(part.weights * scale)
        segment.append(part.segment.astype(np.int64) + len(paths))
        rows.append(part.rows)
        if part.lengths is not None:
            lengths.append(part.lengths)
        paths += part.paths
    segments = np.concatenate(segment)
    # Shuffled, then in a reply's order, as one buffer groups its draw.
    order = rng.permutation(len(segments))
    grouped = order[batch_then_segment(segments[order], batch_size)]
    return SampledItems(
        batch_size=batch_size,
        keys=np.concatenate(keys)[grouped],
        weights=np.concatenate(weights)[grouped],
        segment=segments[grouped].astype(np.int32),
        rows=np.concatenate(rows)[grouped],
        lengths=np.concatenate(lengths)[grouped] if lengths else None,
        paths=paths,
    )


def merge_stats(parts: list[BufferStats]) -> BufferStats:
    """One job's buffer statistics from its shards': counts summed, means weighted by
    each shard's live items, extremes of all, the lag histograms added up."""
    first = parts[0]
    if len(parts) == 1:
        return first
    sizes = [p.size for p in parts]
    total = sum(sizes)

    def mean(name: str) -> float | None:
        values = [(getattr(p, name), p.size) for p in parts if getattr(p, name) is not None]
        weight = sum(size for _, size in values)
        if not values:
            return None
        if not weight:
            return sum(v for v, _ in values) / len(values)
        return sum(v * size for v, size in values) / weight

    def extreme(name: str, pick: Callable[..., Any]) -> Any:
        values = [getattr(p, name) for p in parts if getattr(p, name) is not None]
        return pick(values) if values else None

    evictions: collections.Counter[str] = collections.Counter()
    for p in parts:
        evictions.update(p.evictions)
    inserted = sum(p.limiter.inserted for p in parts)
    sampled = sum(p.limiter.sampled for p in parts)
    return dataclasses.replace(
        first,
        size=total,
        capacity=sum(p.capacity for p in parts),
        inserts=sum(p.inserts for p in parts),
        samples=sum(p.samples for p in parts),
        sample_requests=max(p.sample_requests for p in parts),  # one request asks each
        evictions=dict(evictions),
        use_count_mean=mean("use_count_mean") or 0.0,
        use_count_max=max(p.use_count_max for p in parts),
        learner_version=max(p.learner_version for p in parts),
        staleness_mean=mean("staleness_mean") or 0.0,
        staleness_max=max(p.staleness_max for p in parts),
        sampled_lag_histogram=np.sum([p.sampled_lag_histogram for p in parts], axis=0).tolist(),
        priority_min=extreme("priority_min", min),
        priority_mean=mean("priority_mean"),
        priority_max=extreme("priority_max", max),
        samples_per_insert_ratio=(
            sum(p.samples for p in parts) / sum(p.inserts for p in parts)
            if sum(p.inserts for p in parts)
            else None
        ),
        # Each shard's limiter keeps the job's ratio, bounds included: their counts add.
        limiter=dataclasses.replace(first.limiter, inserted=inserted, sampled=sampled),
        can_sample=any(p.can_sample for p in parts),
        can_insert=all(p.can_insert for p in parts),
        waiting_samplers=sum(p.waiting_samplers for p in parts),
        waiting_inserters=sum(p.waiting_inserters for p in parts),
        live_segments=sum(p.live_segments for p in parts),
        released_segments=sum(p.released_segments for p in parts),
        held_items=sum(p.held_items for p in parts),
    )
