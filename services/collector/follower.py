"""How a collect task keeps acting with the newest policy: `PolicyFollower` asks the
coordinator for the newest version (every `poll_s`, or in a long-poll for the next one)
and loads it into the task's actor, refusing a file another algorithm wrote.

Usage (a collect loop)::

    follower = PolicyFollower(actor, store, ctx.coordinator, job_id, poll_s, algo)
    follower.refresh()                  # each step: a new version when one is out
    follower.wait_newer(timeout_s=1.0)  # a round's loop: until the next version
"""

from __future__ import annotations

import logging
import time

from algorithms.base import Actor
from common.errors import ApiError
from common.http_client import ServiceUnavailable
from common.storage import CorruptFileError, SharedStore
from services.coordinator.client import CoordinatorClient

log = logging.getLogger(__name__)


class PolicyFollower:
    """Keeps an actor at the coordinator's newest version, polling every `poll_s`;
    takes only versions the job's algorithm `algo` wrote."""

    def __init__(
        self,
        policy: Actor,
        store: SharedStore,
        coordinator: CoordinatorClient,
        job_id: str,
        poll_s: float,
        algo: str,
    ) -> None:
        self.policy = policy
        self.store = store
        self.coordinator = coordinator
        self.job_id = job_id
        self.poll_s = poll_s
        self.algo = algo
        self._next_poll_s = 0.0

    def refresh(self) -> None:
        """Take the newest version if one is out; asks at most every `poll_s`."""
        now = time.monotonic()
        if now < self._next_poll_s:
            return
        self._next_poll_s = now + self.poll_s
        self._take_latest()

    def wait_newer(self, timeout_s: float) -> None:
        """Block until a version newer than the one held is loaded, or `timeout_s`:
        the coordinator answers as soon as the learner announces one (a long-poll,
        not a sleep loop)."""
        held = self.policy.version if self.policy.loaded else 0
        started = time.monotonic()
        self._take_latest(newer_than=held, timeout_s=timeout_s)
        # A refused or unreachable answer comes at once: keep to the time asked for.
        if self.policy.version <= held and time.monotonic() - started < timeout_s / 2:
            time.sleep(min(self.poll_s, timeout_s))

    def _take_latest(self, *, newer_than: int | None = None, timeout_s: float = 0.0) -> None:
        try:
            ref = self.coordinator.latest_policy(
                self.job_id, newer_than=newer_than, timeout_s=timeout_s
            )
        except (ApiError, ServiceUnavailable) as exc:
            log.warning("could not ask for the newest policy: %s", exc)
            return
        if ref is None or (self.policy.loaded and ref.version <= self.policy.version):
            return
        try:
            self.store.resolve(ref.path, under=f"{self.job_id}/policies")
            policy_file = self.store.read_policy(ref.path, sha256=ref.sha256, algo=self.algo)
            self.policy.load(ref.version, policy_file.tensors)
        except (OSError, CorruptFileError, ValueError, RuntimeError) as exc:
            # Keep acting with the version we have; the next poll tries again.
            log.warning("policy version %d refused: %s", ref.version, exc)
