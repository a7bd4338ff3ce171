"""Image step data stored with each frame once (common/frames.py): what the collector
writes, what the learner reads back, and what a bad file costs."""

import numpy as np
import pytest

import common.frames as frames
from algorithms.registry import ALGORITHMS
from common.frames import POOL, pack_frames, take, unpack_frames
from common.messages import SampledBatch, SampledSegment
from common.storage import CorruptFileError, SharedStore
from jobconfig import resolve_job_config, with_spaces
from services.collector.step_data import NStepBuilder
from services.learner.segments import SegmentCache, SegmentSchema

STACK, SIDE, ACTIONS = 4, 84, 6


def stacked_transitions(rows, rng, nstep=1):
    """Rows like an Atari env's: each stack shifts one new frame in."""
    film = rng.integers(0, 256, (rows + STACK + nstep, SIDE, SIDE), dtype=np.uint8)
    obs = np.stack([film[i : i + STACK] for i in range(rows)])
    next_obs = np.stack([film[i + nstep : i + nstep + STACK] for i in range(rows)])
    return {
        "obs": obs,
        "action": rng.integers(0, ACTIONS, rows),
        "reward": np.zeros(rows, np.float32),
        "next_obs": next_obs,
        "done": np.zeros(rows, np.float32),
        "discount": np.full(rows, 0.99, np.float32),
    }


def image_schema():
    config, _ = resolve_job_config({"policy": {"type": "dqn"}})
    config = with_spaces(config, (STACK, SIDE, SIDE), ACTIONS, obs_dtype="uint8")
    return SegmentSchema.for_policy(
        config.policy, ALGORITHMS["dqn"].column_names_for(config.policy)
    )


def test_packing_stores_each_frame_once_and_rebuilds_every_row_exactly():
    rng = np.random.default_rng(0)
    columns = stacked_transitions(300, rng, nstep=3)
    packed = pack_frames(columns)
    # The stacks and their next stacks (3 steps on) use frames 0..305 of the film.
    assert len(packed[POOL]) == 300 + 3 + STACK - 1
    assert packed["obs.frames"].shape == (300, STACK) and "obs" not in packed
    restored = unpack_frames(packed)
    for name, array in columns.items():
        np.testing.assert_array_equal(restored[name], array)
    rows = rng.integers(0, 300, 64)
    np.testing.assert_array_equal(take(packed, "next_obs", rows), columns["next_obs"][rows])
    before = sum(a.nbytes for a in columns.values())
    after = sum(a.nbytes for a in packed.values())
    assert after < before / 7


def test_a_hash_collision_never_merges_different_frames(monkeypatch):
    rng = np.random.default_rng(1)
    columns = stacked_transitions(20, rng)
    # Every frame hashes alike: only the byte-for-byte check keeps them apart.
    monkeypatch.setattr(frames, "_MULTIPLIERS", np.zeros_like(frames._MULTIPLIERS))
    restored = unpack_frames(pack_frames(columns))
    np.testing.assert_array_equal(restored["obs"], columns["obs"])
    np.testing.assert_array_equal(restored["next_obs"], columns["next_obs"])


def test_small_and_colour_images_pack_too_and_vectors_are_left_alone():
    rng = np.random.default_rng(2)
    minigrid = rng.integers(0, 4, (50, 3, 7, 7), dtype=np.uint8)
    packed = pack_frames({"obs": minigrid, "reward": np.zeros(50, np.float32)})
    np.testing.assert_array_equal(take(packed, "obs", slice(None)), minigrid)
    vectors = {"obs": rng.standard_normal((8, 4)).astype(np.float32)}
    assert pack_frames(vectors) is vectors


def test_a_packed_segment_round_trips_through_the_store_and_the_learner(tmp_path):
    rng = np.random.default_rng(3)
    store = SharedStore(tmp_path)
    columns = stacked_transitions(40, rng)
    path = store.segment_path("job-1", "w", 0)
    store.write_segment(path, pack_frames(columns))
    assert store.segment_rows(path) == 40  # the pool is not rows
    cache = SegmentCache(store, "job-1", image_schema())
    rows = [3, 0, 39, 3]
    batch = SampledBatch(
        keys=[1, 2, 3, 4],
        segments=[SampledSegment(path=path, rows=rows)],
        weights=[1.0] * 4,
    )
    got, weights, keys = cache.gather(batch)
    assert keys == [1, 2, 3, 4] and len(weights) == 4
    assert got["obs"].dtype == np.uint8 and got["obs"].shape == (4, STACK, SIDE, SIDE)
    np.testing.assert_array_equal(got["obs"], columns["obs"][rows])
    np.testing.assert_array_equal(got["next_obs"], columns["next_obs"][rows])


def test_a_packed_segment_of_small_frames_is_gathered_not_skipped(tmp_path):
    # MiniGrid's 3x7x7 views pack into a pool whose rows are no segment rows: the
    # cache's records (for rows of up to 1 KiB) must leave such a segment alone.
    rng = np.random.default_rng(5)
    store = SharedStore(tmp_path)
    rows = 50
    columns = {
        "obs": rng.integers(0, 4, (rows, 3, 7, 7), dtype=np.uint8),
        "action": rng.integers(0, 3, rows),
        "reward": np.zeros(rows, np.float32),
        "next_obs": rng.integers(0, 4, (rows, 3, 7, 7), dtype=np.uint8),
        "done": np.zeros(rows, np.float32),
        "discount": np.full(rows, 0.99, np.float32),
    }
    packed = pack_frames(columns)
    assert POOL in packed and len(packed[POOL]) != rows
    path = store.segment_path("job-1", "w", 0)
    store.write_segment(path, packed)
    config, _ = resolve_job_config({"policy": {"type": "dqn"}})
    config = with_spaces(config, (3, 7, 7), 3, obs_dtype="uint8")
    schema = SegmentSchema.for_policy(
        config.policy, ALGORITHMS["dqn"].column_names_for(config.policy)
    )
    cache = SegmentCache(store, "job-1", schema)
    picked = [7, 0, 49, 7]
    batch = SampledBatch(
        keys=[1, 2, 3, 4], segments=[SampledSegment(path=path, rows=picked)], weights=[1.0] * 4
    )
    got, _, keys = cache.gather(batch)
    assert keys == [1, 2, 3, 4] and not cache.unusable
    np.testing.assert_array_equal(got["obs"], columns["obs"][picked])
    np.testing.assert_array_equal(got["next_obs"], columns["next_obs"][picked])


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p.update({"obs.frames": p["obs.frames"] + len(p[POOL])}),  # outside
        lambda p: p.update({"obs.frames": p["obs.frames"][:, :2]}),  # wrong stack
        lambda p: p.update({POOL: p[POOL][:, :10]}),  # wrong frame size
        lambda p: p.update({"obs.frames": p["obs.frames"].astype(np.float32)}),
        lambda p: p.pop(POOL),
    ],
)
def test_a_damaged_packed_segment_is_refused_by_the_schema(damage):
    packed = pack_frames(stacked_transitions(10, np.random.default_rng(4)))
    damage(packed)
    with pytest.raises(CorruptFileError):
        image_schema().check(packed)


def test_float_observations_are_refused_where_images_are_expected():
    columns = stacked_transitions(5, np.random.default_rng(5))
    columns["obs"] = columns["obs"].astype(np.float32)
    with pytest.raises(CorruptFileError, match="uint8"):
        image_schema().check(columns)


def test_the_nstep_builder_keeps_uint8_observations():
    builder = NStepBuilder(num_envs=2, nstep=1, gamma=0.99)
    obs = np.zeros((2, STACK, SIDE, SIDE), np.uint8)
    no = np.zeros(2, bool)
    builder.add(obs, np.zeros(2, np.int64), np.ones(2), obs + 1, no, no)
    columns = builder.take()
    assert columns["obs"].dtype == np.uint8 and columns["next_obs"].dtype == np.uint8
