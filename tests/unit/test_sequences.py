"""Sequence replay: the buffer's windows over scripted episodes (never across an
episode's end, every row in some window, overlap as configured), every step learned
by R2D2 in some window (episodes of any length, and long ones the collector cuts into
pieces), the collector's rows grouped by episode, and the learner's [items, time]
batches with a valid mask."""

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from algorithms.r2d2.learner import SequenceBatch, learned_steps, nstep_returns
from algorithms.registry import ALGORITHMS
from common.config import ReplayBufferConfig
from common.messages import CollectSpec, PolicyRef, SampledBatch, SampledSegment, SegmentRef
from common.models import state_to_numpy
from common.storage import SharedStore
from jobconfig import load_config, resolve_job_config
from services.buffer.core import ReplayBuffer, sequence_windows
from services.collector.core import CollectorRunner
from services.collector.step_data import EpisodeRows, NStepBuilder
from tests.algorithm_runs import JOB, Ctx, FakeCoordinator, job_config, publish_fresh_policy
from tests.fakes import DeletedFiles

EPISODES = [1, 5, 8, 9, 13, 20, 3]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def spans_of(lengths):
    starts = np.cumsum([0, *lengths[:-1]])
    return [(int(s), int(n)) for s, n in zip(starts, lengths, strict=True)]


def learned_rows(columns, spans, burnin, unroll, nstep, overlap):
    """Which rows of a segment R2D2 learns in some sequence item: the buffer's windows
    over the segment's episode spans, gathered and padded as the learner gets them,
    and the learner's own mask of the steps an update learns."""
    length = burnin + unroll
    starts, lengths = (np.array(x, np.int64) for x in zip(*spans, strict=True))
    first, rows = sequence_windows(starts, lengths, length, overlap)
    index = first[:, None] + np.arange(length)[None, :]
    valid = np.arange(length)[None, :] < rows[:, None]
    index = np.where(valid, index, first[:, None])  # padding: any row, masked
    window = {name: columns[name][index] for name in ("obs", "action", "reward", "done", "h", "c")}
    window["valid"] = valid.astype(np.float32)
    batch = SequenceBatch.from_numpy(window, np.ones(len(first), np.float32), torch.device("cpu"))
    parts = nstep_returns(batch.reward, batch.done, batch.valid, nstep, 0.99)
    learned = learned_steps(batch, parts, burnin).numpy() > 0
    covered = np.zeros(len(columns["obs"]), bool)
    covered[index[learned]] = True
    return covered


def scripted_rows(lengths, terminated, hidden=4):
    """Episodes one after another, as the actor records them: the stored state is
    zeros at each episode's first step only; `done` where an episode terminated."""
    total = sum(lengths)
    done = np.zeros(total, np.float32)
    state = np.ones((total, hidden), np.float32)
    for (start, n), ends in zip(spans_of(lengths), terminated, strict=True):
        state[start] = 0.0
        done[start + n - 1] = float(ends)
    columns = {
        "obs": np.zeros((total, 2), np.float32),
        "action": np.zeros(total, np.int64),
        "reward": np.ones(total, np.float32),
        "done": done,
        "h": state,
        "c": state.copy(),
    }
    return columns


def r2d2_sequences(path):
    config, _ = resolve_job_config(load_config(path)[0])
    policy = config.policy
    buffer = policy.other.replay_buffer
    return policy.burnin_step, policy.unroll_len, policy.nstep, buffer.overlap


#: (burn-in, learned steps, nstep, overlap) of sequences: the examples', and others at
#: the least overlap the config allows.
SEQUENCES = [
    pytest.param(*r2d2_sequences(EXAMPLES / name), id=name)
    for name in ("cartpole_pomdp_r2d2.yaml", "pong_r2d2.yaml", "di_engine/cartpole_r2d2_config.py")
] + [(3, 5, 2, 5), (0, 6, 3, 3), (6, 10, 1, 7)]
LENGTHS = [1, 2, 3, 4, 7, 19, 20, 21, 44, 45, 46, 80, 81, 200, 333]


@pytest.mark.parametrize(("burnin", "unroll", "nstep", "overlap"), SEQUENCES)
def test_every_step_of_any_episode_is_learned_by_some_sequence(burnin, unroll, nstep, overlap):
    """Terminated episodes have every step learned; one a time limit ended has all
    but its last nstep (nothing follows them to bootstrap from). With one row less
    overlap, some step of a long episode is never learned."""
    lengths = LENGTHS * 2
    terminated = [True] * len(LENGTHS) + [False] * len(LENGTHS)
    columns = scripted_rows(lengths, terminated)
    expected = np.ones(sum(lengths), bool)
    for (start, n), ends in zip(spans_of(lengths), terminated, strict=True):
        if not ends:
            expected[start + max(0, n - nstep) : start + n] = False
    spans = spans_of(lengths)
    covered = learned_rows(columns, spans, burnin, unroll, nstep, overlap)
    np.testing.assert_array_equal(covered, expected)
    assert overlap >= burnin + nstep  # the config's check
    less = learned_rows(columns, spans, burnin, unroll, nstep, burnin + nstep - 1)
    assert (expected & ~less).any()


@pytest.mark.parametrize(("length", "overlap"), [(8, 3), (8, 0), (4, 3), (1, 0), (30, 10)])
def test_windows_cover_every_row_overlap_as_configured_and_stay_in_their_episode(length, overlap):
    spans = spans_of(EPISODES)
    starts = np.array([s for s, _ in spans])
    lengths = np.array([n for _, n in spans])
    first, rows = sequence_windows(starts, lengths, length, overlap)
    covered = np.zeros(sum(EPISODES), bool)
    for start, n in spans:
        mine = (first >= start) & (first < start + n)
        f, r = first[mine], rows[mine]
        assert (f + r <= start + n).all() and (r >= 1).all() and (r <= length).all()
        for a, k in zip(f, r, strict=True):
            covered[a : a + k] = True
        # consecutive windows share exactly `overlap` rows (or the episode's rest)
        ends = f + r
        shared = ends[:-1] - f[1:]
        assert (shared == overlap).all() or n <= length, (start, n, f, r)
    assert covered.all()


def test_the_buffer_samples_sequences_inside_episodes_and_every_row_in_some():
    config = ReplayBufferConfig(
        replay_buffer_size=1000,
        min_size_to_sample=1,
        item="sequence",
        sequence_length=6,
        overlap=2,
    )
    buf = ReplayBuffer("job-1", config, DeletedFiles(), error_buffer=0.0)
    spans = spans_of(EPISODES)
    path = "job-1/segments/w/00000000.safetensors"
    rows = sum(EPISODES)
    buf.insert([SegmentRef(path=path, rows=rows, env_steps=rows, policy_version=0, episodes=spans)])
    seen = np.zeros(rows, bool)
    for batch in buf.sample(8, 64, timeout_s=1.0):
        for segment in batch.segments:
            for first, length in zip(segment.rows, segment.lengths, strict=True):
                episode = next(s for s in spans if s[0] <= first < s[0] + s[1])
                assert first + length <= episode[0] + episode[1]
                assert 1 <= length <= 6
                seen[first : first + length] = True
    assert seen.all()
    # Windows of an episode longer than a window overlap by 2 rows.
    assert buf.size == len(sequence_windows(*map(np.array, zip(*spans, strict=True)), 6, 2)[0])


def test_an_episode_span_past_the_segment_or_overlapping_another_is_refused():
    config = ReplayBufferConfig(item="sequence", sequence_length=4, overlap=1)
    buf = ReplayBuffer("job-1", config, DeletedFiles(), error_buffer=0.0)
    path = "job-1/segments/w/00000000.safetensors"
    for episodes, what in [([(0, 5), (5, 6)], "past"), ([(0, 5), (4, 3)], "overlap")]:
        bad = SegmentRef(path=path, rows=10, env_steps=10, policy_version=0, episodes=episodes)
        with pytest.raises(ValueError, match=what):
            buf.insert([bad])


def test_collector_rows_come_out_grouped_by_episode_with_their_spans():
    rng = np.random.default_rng(0)
    envs = 4
    builder = NStepBuilder(envs, 1, 0.99)
    grouped = EpisodeRows(envs, max_piece_rows=7)
    t = np.zeros(envs, np.int64)
    out_columns, out_spans = [], []
    for _ in range(200):
        obs = np.stack([np.arange(envs), t], axis=1).astype(np.float32)  # (env, step)
        ended = rng.random(envs) < 0.15
        builder.add(obs, np.zeros(envs, np.int64), np.ones(envs), obs, ended, np.zeros(envs, bool))
        t = np.where(ended, 0, t + 1)
        grouped.add(builder.take(where=True))
        if len(grouped) >= 10:
            columns, spans = grouped.take(max_rows=20)
            assert sum(n for _, n in spans) == len(columns["obs"]) <= 20 or len(spans) == 1
            out_columns.append(columns)
            out_spans.append(spans)
    pieces = 0
    for columns, spans in zip(out_columns, out_spans, strict=True):
        for start, n in spans:
            obs = columns["obs"][start : start + n]
            assert (obs[:, 0] == obs[0, 0]).all()  # one env
            assert (np.diff(obs[:, 1]) == 1).all()  # its consecutive steps
            assert n <= 7
            pieces += 1
    assert pieces > 20


#: Each env's scripted episodes (steps, terminated): one longer than many uploads,
#: ones of exactly one or two pieces, and short ones between.
SCRIPT = [
    [(500, True), (3, True)],
    [(80, True), (150, False), (1, True), (79, True), (81, True), (220, True), (37, False)],
]


@pytest.mark.parametrize(
    ("burnin", "unroll", "nstep", "overlap", "max_rows"),
    [(2, 18, 5, 10, 80), (8, 12, 3, 11, 50), (0, 6, 2, 2, 3)],
)
def test_episodes_cut_into_pieces_have_every_step_learned_and_counted_once(
    burnin, unroll, nstep, overlap, max_rows
):
    """Long episodes go out in pieces of at most one upload, each after the first
    starting with the rows consecutive sequences share: the buffer takes each piece as
    a span of its own, every step of a terminated episode is learned in some sequence
    (of a truncated one, all but its last nstep), and each step is stored once besides
    the copies carried into the next piece."""
    envs = len(SCRIPT)
    builder = NStepBuilder(envs, 1, 0.99)
    grouped = EpisodeRows(envs, max_piece_rows=max_rows, overlap_rows=overlap)
    # Each env's episodes as (episode, step) ids, and what the env is at now.
    episode = np.zeros(envs, np.int64)
    step = np.zeros(envs, np.int64)
    hidden = 4
    outputs = []
    steps = max(sum(n for n, _ in script) for script in SCRIPT)
    for _ in range(steps + 1):  # an env past its script starts an episode never ended
        lengths = [
            SCRIPT[e][episode[e]] if episode[e] < len(SCRIPT[e]) else (10**9, False)
            for e in range(envs)
        ]
        last = np.array([step[e] + 1 == lengths[e][0] for e in range(envs)])
        terminated = last & np.array([ends for _, ends in lengths])
        obs = np.stack([np.arange(envs), episode, step], axis=1).astype(np.float32)
        state = np.where((step == 0)[:, None], 0.0, 1.0) * np.ones((envs, hidden))
        builder.add(
            obs,
            np.zeros(envs, np.int64),
            np.ones(envs),
            obs,
            terminated,
            last & ~terminated,
            {"h": state, "c": state},
        )
        grouped.add(builder.take(where=True))
        while len(grouped) >= max_rows:
            outputs.append(grouped.take(max_rows))
        episode, step = np.where(last, episode + 1, episode), np.where(last, 0, step + 1)
    while len(grouped):
        outputs.append(grouped.take(max_rows))

    config = ReplayBufferConfig(
        replay_buffer_size=100_000,
        item="sequence",
        sequence_length=burnin + unroll,
        overlap=overlap,
    )
    buf = ReplayBuffer("job-1", config, DeletedFiles(), error_buffer=0.0)
    learned: set[tuple[int, int, int]] = set()
    stored: list[tuple[int, int, int]] = []
    carried_pieces = 0
    for seq, (columns, spans) in enumerate(outputs):
        rows = len(columns["obs"])
        assert rows <= max_rows or len(spans) == 1
        path = f"job-1/segments/w/{seq:08d}.safetensors"
        ref = SegmentRef(path=path, rows=rows, env_steps=0, policy_version=0, episodes=spans)
        buf.insert([ref])  # refuses spans that overlap or run past the segment
        covered = learned_rows(columns, spans, burnin, unroll, nstep, overlap)
        ids = [(int(e), int(k), int(t)) for e, k, t in columns["obs"]]
        learned |= {ids[i] for i in np.flatnonzero(covered)}
        stored += ids
        for start, n in spans:
            env, number, first = ids[start]
            assert ids[start : start + n] == [(env, number, first + t) for t in range(n)]
            carried_pieces += first > 0

    expected = set()
    finished = set()
    for e, script in enumerate(SCRIPT):
        for k, (n, ends) in enumerate(script):
            expected |= {(e, k, t) for t in range(n if ends else n - nstep)}
            finished |= {(e, k, t) for t in range(n)}
    assert expected <= learned
    # Every finished episode's steps stored (and pieces of the endless ones after),
    # each once but for the copies each piece after an episode's first starts with.
    assert finished <= set(stored)
    assert all(k == len(SCRIPT[e]) for e, k, _ in set(stored) - finished)
    assert carried_pieces > 0
    assert len(stored) == len(set(stored)) + overlap * carried_pieces


def test_a_segment_of_episodes_carries_the_version_of_its_oldest_row(tmp_path):
    """Rows wait in the collector until their episode ends, while newer versions act:
    the segment is labelled with the oldest version that acted one of its rows (what
    the buffer's staleness limit judges), not the one acting when it is taken."""
    store = SharedStore(tmp_path)
    config = job_config("r2d2", "discrete", policy={"collect": {"policy_poll_s": 1e-6}})
    first = publish_fresh_policy(store, config)
    learner = ALGORITHMS["r2d2"].make_learner(config.policy, "cpu")
    path, sha = store.write_policy(JOB, 2, 1, "r2d2", state_to_numpy(learner.online))
    second = PolicyRef(version=2, path=path, sha256=sha, train_iter=1)

    class NewerAfterThreeSteps(FakeCoordinator):
        """Version 1 for the first three steps' polls, then version 2."""

        answers = 0

        def latest_policy(self, job_id, *, newer_than=None, timeout_s=0.0):
            self.answers += 1
            return first if self.answers <= 3 else second

    stop = threading.Event()
    ctx = Ctx(NewerAfterThreeSteps(stop), stop)
    spec = CollectSpec(seed=0, num_envs=2, mode="transitions")
    CollectorRunner(store).collect(ctx, config, spec)
    (ref, *_) = ctx.coordinator.inserted
    # CartPole's episodes last more than three steps: version 2 acted before any ended.
    assert ctx.progress["policy_version"] == 2
    assert ref.policy_version == 1


def test_the_learner_gets_items_by_time_with_padding_masked(tmp_path):
    from common.storage import SharedStore
    from jobconfig import fit_to_env, resolve_job_config
    from services.learner.segments import VALID, SegmentCache, SegmentSchema

    config = fit_to_env(resolve_job_config({"policy": {"type": "dqn"}})[0])
    schema = SegmentSchema.for_policy(config.policy, ("obs", "action", "reward"))
    store = SharedStore(tmp_path)
    path = store.segment_path("job-1", "w", 0)
    rows = 12
    store.write_segment(
        path,
        {
            "obs": np.arange(rows * 4, dtype=np.float32).reshape(rows, 4),
            "action": np.zeros(rows, np.int64),
            "reward": np.arange(rows, dtype=np.float32),
        },
    )
    cache = SegmentCache(store, "job-1", schema, sequence_length=5)
    batch = SampledBatch(
        keys=[1, 2],
        segments=[SampledSegment(path=path, rows=[2, 9], lengths=[5, 3])],
        weights=[0.5, 1.0],
    )
    columns, weights, keys = cache.gather(batch)
    assert keys == [1, 2] and weights.tolist() == [0.5, 1.0]
    assert columns["reward"].shape == (2, 5) and columns["obs"].shape == (2, 5, 4)
    assert columns["reward"][0].tolist() == [2, 3, 4, 5, 6]
    assert columns[VALID].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert columns["reward"][1][:3].tolist() == [9, 10, 11]
    # A span longer than the sequence, or running off the segment, skips the segment.
    bad = SampledBatch(
        keys=[3], segments=[SampledSegment(path=path, rows=[10], lengths=[5])], weights=[1.0]
    )
    columns, weights, keys = cache.gather(bad)
    assert keys == [] and path in cache.unusable


def test_a_segment_whose_recurrent_state_is_of_the_wrong_size_is_skipped(tmp_path):
    from algorithms.registry import ALGORITHMS
    from common.storage import SharedStore
    from jobconfig import fit_to_env, resolve_job_config
    from services.learner.segments import SegmentCache, SegmentSchema

    raw = {"env": {"observation_filter": [0, 2]}, "policy": {"type": "r2d2"}}
    config = fit_to_env(resolve_job_config(raw)[0])
    names = ALGORITHMS["r2d2"].column_names_for(config.policy)
    schema = SegmentSchema.for_policy(config.policy, names)
    hidden = config.policy.model.lstm_hidden_size
    rows = 10
    good = {
        "obs": np.zeros((rows, 2), np.float32),
        "action": np.zeros(rows, np.int64),
        "reward": np.ones(rows, np.float32),
        "done": np.zeros(rows, np.float32),
        "h": np.zeros((rows, hidden), np.float32),
        "c": np.zeros((rows, hidden), np.float32),
    }
    store = SharedStore(tmp_path)
    cache = SegmentCache(store, "job-1", schema, sequence_length=config.policy.sequence_length)
    for seq, columns in enumerate([good, {**good, "h": np.zeros((rows, hidden + 1), np.float32)}]):
        path = store.segment_path("job-1", "w", seq)
        store.write_segment(path, columns)
        assert (cache.get(path) is None) == (seq == 1)
    assert len(cache.unusable) == 1
