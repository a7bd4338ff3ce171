"""A collector refuses a corrupted or tampered policy version, or one another algorithm
wrote, and keeps the one it has."""

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
