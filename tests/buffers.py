"""Replay buffers built in memory for the buffer tests: segment references, a buffer
that deletes nothing, a restored copy, its columns and sum tree compared, and churn
that writes every kind of column."""

from __future__ import annotations

import dataclasses

import numpy as np

from common.config import ReplayBufferConfig
from common.messages import SegmentRef
from services.buffer.core import ReplayBuffer
from services.buffer.table import COLUMNS
from tests.fakes import DeletedFiles


def ref(seq, rows=10, version=0, worker="w"):
    return SegmentRef(
        path=f"job-1/segments/{worker}/{seq:08d}.safetensors",
        rows=rows,
        env_steps=rows,
        policy_version=version,
    )


def make(seed=0, **config):
    config.setdefault("min_size_to_sample", 1)
    return ReplayBuffer(
        "job-1",
        ReplayBufferConfig(**config),
        DeletedFiles(),
        error_buffer=0.0,
        seed=seed,
        release_grace_s=0.0,
    )


def restored(buf, data, meta, seed=999):
    copy = ReplayBuffer(
        "job-1", buf.config, DeletedFiles(), error_buffer=0.0, seed=seed, release_grace_s=0.0
    )
    copy.restore_snapshot(bytes(data), meta)
    return copy


def columns(buf):
    return {c: getattr(buf.table, c).copy() for c in COLUMNS}


def assert_columns_equal(got, want):
    for c in COLUMNS:
        np.testing.assert_array_equal(got[c], want[c], err_msg=c)


def assert_same_tree(got, want):
    """The sum trees (of samplers that have one) are equal to the last bit."""
    if hasattr(want.sampler, "tree"):
        assert got.sampler.tree.total == want.sampler.tree.total
        assert got.sampler.tree.min == want.sampler.tree.min
        np.testing.assert_array_equal(got.sampler.tree.leaves(), want.sampler.tree.leaves())


def quiet(stats):
    """Stats without the waiters of the moment (a restored buffer has none)."""
    return dataclasses.replace(stats, waiting_samplers=0, waiting_inserters=0)


PER = dict(type="prioritized", alpha=0.6, beta=0.4, priority_eps=1e-6)


def churn(buf, seq, rng):
    """Every kind of column write: inserts that evict, samples (uses, max_use),
    priority updates, staleness evictions."""
    buf.insert([ref(seq, rows=int(rng.integers(1, 30)), version=seq // 3)], force=True)
    batch_size = min(8, buf.size // 2)
    for batch in buf.sample(batch_size, 2, timeout_s=0) if batch_size else []:
        buf.update_priorities(batch.keys, rng.uniform(0.01, 5.0, len(batch.keys)).tolist())
    if seq % 5 == 0:
        buf.set_learner_version(seq // 3)
