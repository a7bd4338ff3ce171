"""A learner's feeder process (services/learner/feeder.py) against a real coordinator
on 127.0.0.1: the batches it hands over are rows of the segments the buffer holds, a
segment it cannot use is reported to its learner, and a job that ends ends it."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from common.messages import SegmentRef
from common.storage import SharedStore
from drover.local import LocalCluster
from jobconfig import algorithm_of, read_job_config
from services.learner.feeder import ProcessFeed, feeder_start
from services.learner.sampling import JobOver
from services.learner.segments import SegmentSchema
from tests.coordinator_app import CONFIG
from tests.helpers import wait_until

pytestmark = [pytest.mark.processes]

ROWS = 16


def segment(store: SharedStore, job_id: str, number: int, action: int = 0) -> SegmentRef:
    """A segment whose rows say where they come from: obs[:, 0] is number * 100 + row,
    next_obs is obs + 0.5. `action` 5 is no CartPole action: the segment is unusable."""
    obs = np.zeros((ROWS, 4), np.float32)
    obs[:, 0] = number * 100 + np.arange(ROWS)
    columns = {
        "obs": obs,
        "action": np.full(ROWS, action, np.int64),
        "reward": np.ones(ROWS, np.float32),
        "next_obs": obs + 0.5,
        "done": np.zeros(ROWS, np.float32),
        "discount": np.full(ROWS, 0.99, np.float32),
    }
    path = store.segment_path(job_id, "w", number)
    store.write_segment(path, columns, header={"policy_version": 0})
    return SegmentRef(path=path, rows=ROWS, env_steps=ROWS, policy_version=0)


@pytest.mark.timeout(120)
def test_a_feeder_hands_over_the_buffers_rows_and_reports_an_unusable_segment(tmp_path):
    with LocalCluster(tmp_path / "run", num_collectors=0, num_learners=0) as cluster:
        job_id = cluster.client.submit_job(CONFIG).job_id
        store = SharedStore(cluster.shared_dir)
        good = [segment(store, job_id, n) for n in range(3)]
        bad = segment(store, job_id, 3, action=5)
        cluster.data.insert_segments(job_id, [*good, bad])
        config = read_job_config(store, job_id)
        names = algorithm_of(config).column_names_for(config.policy)
        start = feeder_start(
            cluster.data,
            job_id,
            None,  # a tool's requests: no task of the coordinator's
            str(store.root),
            SegmentSchema.for_policy(config.policy, names),
            batch_size=8,
            num_batches=2,
            sample_timeout_s=2.0,
            sequence_length=None,
        )
        unusable: set[str] = set()
        stop = threading.Event()
        feed = ProcessFeed.start(start, stop, unusable)
        try:
            replies = 0

            def a_reply_reports_the_bad_segment() -> bool:
                nonlocal replies
                reply = feed.next()
                assert reply is not None
                replies += 1
                batches = list(reply.batches)
                for batch in batches:
                    obs, next_obs = batch.columns["obs"], batch.columns["next_obs"]
                    assert len(batch.keys) == len(batch.weights) == len(obs) <= 8
                    assert np.all(batch.weights > 0)
                    # every row is one of the good segments' rows, whole
                    assert set(obs[:, 0].tolist()) <= {
                        n * 100 + r for n in range(3) for r in range(ROWS)
                    }
                    assert np.array_equal(next_obs, obs + 0.5)
                    assert np.all(batch.columns["action"] == 0)
                keys = [k for b in batches for k in b.keys]
                feed.trained(reply.hold_id, keys, [1.0] * len(keys))
                return bad.path in unusable

            wait_until(a_reply_reports_the_bad_segment, 60, "the bad segment reported")
            assert unusable == {bad.path} and replies >= 1
            cluster.client.stop_job(job_id)
            with pytest.raises(JobOver):
                while (reply := feed.next()) is not None:
                    list(reply.batches)
        finally:
            feed.close()
        assert feed.process.returncode is not None
