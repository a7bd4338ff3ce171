"""Fencing a learner whose lease was taken over (docs/architecture.md, "Fencing"): each
learn task carries a higher epoch; policy versions are written once, checkpoints are
named and ordered by epoch, and the coordinator refuses an announcement of a stale
epoch, so a learner that wakes after its successor took over spoils nothing (the
coordinator's side: tests/service/test_fencing.py)."""

import numpy as np
import pytest

from common.checkpoint_file import Checkpoint, write_checkpoint
from common.storage import SharedStore, checkpoint_key
from services.learner.sampling import JobOver
from services.learner.sessions import KEEP_CHECKPOINTS
from tests.learner_sessions import JOB, Coordinator, session


def test_a_policy_version_is_written_once(tmp_path):
    store = SharedStore(tmp_path)
    path, sha = store.write_policy(JOB, 3, 10, "dqn", {"w": np.ones(2)}, epoch=2)
    with pytest.raises(FileExistsError):
        store.write_policy(JOB, 3, 99, "dqn", {"w": np.zeros(2)}, epoch=1)
    policy = store.read_policy(path, sha256=sha)
    assert (policy.train_iter, policy.epoch) == (10, 2)
    assert store.list_dir(f"{JOB}/policies") == ["00000003.safetensors"]  # no temp left


def test_checkpoints_sort_by_epoch_then_train_iter():
    assert checkpoint_key("learner-e00000002-0000000010.safetensors") == (2, 10)
    assert checkpoint_key("learner-0000000500.safetensors") == (0, 500)  # before epochs
    assert checkpoint_key(".learner-e1-2.safetensors.x.tmp") is None
    assert checkpoint_key("learner-e00000001-0000000010.safetensors") < (2, 5)


def test_a_stale_learner_that_wakes_late_spoils_nothing_its_successor_wrote(tmp_path):
    store = SharedStore(tmp_path)
    coordinator = Coordinator(epoch=1)
    old = session(store, coordinator, epoch=1)
    old.publish()  # version 1
    old.learner.train_iter = 100
    old.checkpoint()
    old.learner.train_iter = 200
    old.publish()  # version 2 ... then it freezes here, and its lease is taken over

    coordinator.epoch = 2
    new = session(store, coordinator, epoch=2)
    assert new.learner.train_iter == 200  # from the newest published version
    new.publish()  # version 3
    new.learner.train_iter = 210
    new.checkpoint()
    new.learner.train_iter = 220
    new.checkpoint()
    mine = store.read_bytes(store.policy_path(JOB, 3))
    checkpoints = store.checkpoints(JOB)

    # The old one wakes: its next version's file is the successor's, so it goes past
    # it, and its announcement is refused (its task is over).
    with pytest.raises(JobOver):
        old.publish()
    assert old.written_version == 4 and old.version == 4
    assert store.read_bytes(store.policy_path(JOB, 3)) == mine
    # Its checkpoints never touch a later epoch's, nor sort past them.
    for train_iter in (300, 400, 500):
        old.learner.train_iter = train_iter
        old.checkpoint()
    names = store.checkpoints(JOB)
    assert [n for n in names if checkpoint_key(n)[0] == 2] == checkpoints[-KEEP_CHECKPOINTS:]
    assert names[-1] == checkpoints[-1]
    assert coordinator.announced[-1].version == 3

    # The successor goes on past the stale file, and a later learner resumes from
    # the successor's newest checkpoint, not the stale one's higher train_iter.
    new.publish()
    assert coordinator.announced[-1].version == 5
    third = session(store, coordinator, epoch=3)
    assert third.version == 5
    assert third.learner.train_iter == 220  # not the stale lease's 500
    for session_ in (old, new, third):
        session_.writes.close()


def test_a_checkpoint_of_an_older_epoch_is_never_deleted_past_the_newest_kept(tmp_path):
    store = SharedStore(tmp_path)
    learn = session(store, Coordinator(epoch=5), epoch=5)
    write_checkpoint(store, JOB, 900, Checkpoint({}, 0, "dqn"), epoch=6)  # a successor's
    for train_iter in (1, 2, 3):
        learn.learner.train_iter = train_iter
        learn.checkpoint()
    assert [checkpoint_key(n) for n in store.checkpoints(JOB)] == [(5, 2), (5, 3), (6, 900)]
    learn.writes.close()
