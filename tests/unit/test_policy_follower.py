"""A collector refuses a corrupted or tampered policy version, or one another algorithm
wrote, and keeps the one it has."""

import threading
import time

import numpy as np

from algorithms.dqn.actor import QPolicy
from algorithms.dqn.networks import QNetwork
from common.messages import PolicyRef
from common.models import state_to_numpy
from common.storage import SharedStore
from jobconfig import resolve_job_config, with_spaces
from services.collector.follower import PolicyFollower


class Pointer:
    """A coordinator client whose latest policy is whatever the test says."""

    def __init__(self):
        self.latest = None

    def latest_policy(self, job_id, **_):
        return self.latest


def test_corrupted_and_tampered_policies_are_refused(tmp_path):
    store = SharedStore(tmp_path)
    config, _ = resolve_job_config({})
    policy_config = with_spaces(config, 4, 2).policy
    good = state_to_numpy(QNetwork(policy_config.model))
    path, sha = store.write_policy("job-1", 1, 10, "dqn", good)
    pointer = Pointer()
    policy = QPolicy(policy_config)
    follower = PolicyFollower(policy, store, pointer, "job-1", poll_s=0.0, algo="dqn")

    pointer.latest = PolicyRef(version=1, path=path, sha256=sha, train_iter=10)
    follower.refresh()
    assert (policy.version, policy.loaded) == (1, True)
    before = {k: v.clone() for k, v in policy.network.state_dict().items()}

    # a truncated file under a newer version
    bad_path = store.policy_path("job-1", 2)
    store.write_bytes(bad_path, store.read_bytes(path)[:100])
    pointer.latest = PolicyRef(version=2, path=bad_path, sha256="0" * 64, train_iter=20)
    follower.refresh()
    # a whole file whose digest does not match the announced one (tampered)
    other, _ = store.write_policy("job-1", 3, 30, "dqn", {k: v + 1 for k, v in good.items()})
    pointer.latest = PolicyRef(version=3, path=other, sha256=sha, train_iter=30)
    follower.refresh()
    # a path outside the job's policies
    pointer.latest = PolicyRef(
        version=4, path="job-2/policies/00000004.safetensors", sha256=sha, train_iter=40
    )
    follower.refresh()
    # a whole file, as announced, but written by another algorithm (same tensor names)
    ppo_path, ppo_sha = store.write_policy("job-1", 5, 50, "ppo", good)
    pointer.latest = PolicyRef(version=5, path=ppo_path, sha256=ppo_sha, train_iter=50)
    follower.refresh()

    assert policy.version == 1  # still the last good version
    after = policy.network.state_dict()
    assert all(np.array_equal(before[k].numpy(), after[k].numpy()) for k in before)


class CountingPointer(Pointer):
    """A Pointer that records which threads asked."""

    def __init__(self):
        super().__init__()
        self.askers = set()

    def latest_policy(self, job_id, **kwargs):
        self.askers.add(threading.get_ident())
        return super().latest_policy(job_id, **kwargs)


def refresh_until(follower, policy, version, deadline_s=5.0):
    deadline = time.monotonic() + deadline_s
    while policy.version != version and time.monotonic() < deadline:
        follower.refresh()
        time.sleep(0.005)
    return policy.version


def test_polling_ahead_reads_versions_off_the_stepping_thread(tmp_path, monkeypatch):
    store = SharedStore(tmp_path)
    config, _ = resolve_job_config({})
    policy_config = with_spaces(config, 4, 2).policy
    weights = state_to_numpy(QNetwork(policy_config.model))
    pointer = CountingPointer()
    path, sha = store.write_policy("job-1", 1, 10, "dqn", weights)
    pointer.latest = PolicyRef(version=1, path=path, sha256=sha, train_iter=10)
    policy = QPolicy(policy_config)
    loaders = []
    load = policy.load
    monkeypatch.setattr(
        policy, "load", lambda *a: (loaders.append(threading.get_ident()), load(*a))
    )
    readers = []
    read_policy = store.read_policy
    monkeypatch.setattr(
        store,
        "read_policy",
        lambda *a, **k: (readers.append(threading.get_ident()), read_policy(*a, **k))[1],
    )
    follower = PolicyFollower(policy, store, pointer, "job-1", poll_s=0.01, algo="dqn")
    try:
        follower.poll_ahead()  # the version out now is taken at once, as refresh would
        assert (policy.version, policy.loaded) == (1, True)
        pointer.askers.clear()
        readers.clear()

        # corrupted, tampered and foreign versions are never swapped in ...
        bad_path = store.policy_path("job-1", 2)
        store.write_bytes(bad_path, store.read_bytes(path)[:100])
        pointer.latest = PolicyRef(version=2, path=bad_path, sha256="0" * 64, train_iter=20)
        assert refresh_until(follower, policy, 2, deadline_s=0.3) == 1
        ppo_path, ppo_sha = store.write_policy("job-1", 3, 30, "ppo", weights)
        pointer.latest = PolicyRef(version=3, path=ppo_path, sha256=ppo_sha, train_iter=30)
        assert refresh_until(follower, policy, 3, deadline_s=0.3) == 1

        # ... and a good one is, by refresh, on the calling thread
        newer = {k: v + 1 for k, v in weights.items()}
        path4, sha4 = store.write_policy("job-1", 4, 40, "dqn", newer)
        pointer.latest = PolicyRef(version=4, path=path4, sha256=sha4, train_iter=40)
        assert refresh_until(follower, policy, 4) == 4
        got = state_to_numpy(policy.network)
        assert all(np.array_equal(got[k], newer[k]) for k in newer)
    finally:
        follower.close()
    me = threading.get_ident()
    assert pointer.askers and me not in pointer.askers  # no request on this thread
    assert readers and me not in readers  # no file read or digest on it either
    assert set(loaders) == {me}  # the weights swapped in between steps, here


def test_a_version_read_ahead_never_replaces_a_newer_one(tmp_path):
    store = SharedStore(tmp_path)
    config, _ = resolve_job_config({})
    policy_config = with_spaces(config, 4, 2).policy
    weights = state_to_numpy(QNetwork(policy_config.model))
    pointer = Pointer()
    policy = QPolicy(policy_config)
    follower = PolicyFollower(policy, store, pointer, "job-1", poll_s=0.01, algo="dqn")
    follower._read_ahead = (3, weights)  # what the poller read before `wait_newer` ran
    follower._poller = threading.current_thread()  # polling ahead, as far as refresh sees
    policy.load(5, weights)
    follower.refresh()
    assert policy.version == 5
