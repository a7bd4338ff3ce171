"""How a collect task keeps acting with the newest policy: `PolicyFollower` asks the
coordinator for the newest version (every `poll_s`, or in a long-poll for the next one)
and loads it into the task's actor, refusing a file another algorithm wrote.

Usage (a collect loop)::

    follower = PolicyFollower(actor, store, ctx.coordinator, job_id, poll_s, algo)
    follower.refresh()                  # each step: a new version when one is out
    follower.wait_newer(timeout_s=1.0)  # a round's loop: until the next version

    follower.poll_ahead()               # a loop that steps without waiting for versions:
    follower.refresh()                  # each step swaps in what the poller has read
    follower.close()
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

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
        #: Polling ahead: the poller's thread, the newest version it has read (and its
        #: weights) that `refresh` has not swapped in yet, and the newest it has read.
        self._poller: threading.Thread | None = None
        self._read_ahead: tuple[int, dict[str, np.ndarray]] | None = None
        self._newest_read = -1
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def refresh(self) -> None:
        """Take the newest version if one is out; asks at most every `poll_s`. Once
        polling ahead, only swaps in the weights the poller has read: no request, no
        file read, no digest on the calling thread."""
        if self._poller is not None:
            with self._lock:
                read, self._read_ahead = self._read_ahead, None
            # `wait_newer` may have loaded a newer one on this thread meanwhile.
            if read is not None and read[0] > self._held():
                self._load(*read)
            return
        now = time.monotonic()
        if now < self._next_poll_s:
            return
        self._next_poll_s = now + self.poll_s
        self._take_latest()

    def poll_ahead(self) -> None:
        """Ask for new versions and read them on a thread of its own from now on.

        A loop that steps envs without waiting for versions (transitions, unrolls)
        spent the round trip to the coordinator every `poll_s`, and on a new version
        the file's read and digest, on its stepping thread; now each step only swaps
        in weights already read, between steps, so no act ever sees a half-loaded
        network. The version out now is taken here first, as `refresh` would."""
        self.refresh()
        self._newest_read = self._held()
        self._poller = threading.Thread(target=self._poll, name="policy-poller", daemon=True)
        self._poller.start()

    def close(self) -> None:
        """Stop polling ahead. A request under way may still run out its timeout: the
        thread is a daemon that holds nothing the task needs."""
        self._closed.set()
        if self._poller is not None:
            self._poller.join(timeout=1.0)

    def _poll(self) -> None:
        while not self._closed.wait(self.poll_s):
            read = self._read_newest(held=self._newest_read)
            if read is not None:
                with self._lock:
                    self._read_ahead = read
                self._newest_read = read[0]

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
        read = self._read_newest(held=self._held(), newer_than=newer_than, timeout_s=timeout_s)
        if read is not None:
            self._load(*read)

    def _read_newest(
        self, *, held: int, newer_than: int | None = None, timeout_s: float = 0.0
    ) -> tuple[int, dict[str, np.ndarray]] | None:
        """The newest version's number and weights, read and checked, when it is newer
        than `held`; None otherwise, or when asking or reading failed (logged: the
        actor keeps the version it has, and the next poll tries again)."""
        try:
            ref = self.coordinator.latest_policy(
                self.job_id, newer_than=newer_than, timeout_s=timeout_s
            )
        except (ApiError, ServiceUnavailable) as exc:
            log.warning("could not ask for the newest policy: %s", exc)
            return None
        if ref is None or ref.version <= held:
            return None
        try:
            self.store.resolve(ref.path, under=f"{self.job_id}/policies")
            policy_file = self.store.read_policy(ref.path, sha256=ref.sha256, algo=self.algo)
        except (OSError, CorruptFileError, ValueError) as exc:
            log.warning("policy version %d refused: %s", ref.version, exc)
            return None
        return ref.version, policy_file.tensors

    def _held(self) -> int:
        """The version the actor acts with; -1 before its first."""
        return self.policy.version if self.policy.loaded else -1

    def _load(self, version: int, tensors: dict[str, np.ndarray]) -> None:
        try:
            self.policy.load(version, tensors)
        except (ValueError, RuntimeError) as exc:  # weights that do not fit the network
            log.warning("policy version %d refused: %s", version, exc)
