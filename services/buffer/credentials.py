"""Task credentials: what lets a worker use a buffer process for one task of one job,
checked by the buffer process on every request without asking the coordinator.

The coordinator signs, for each collect or learn task whose job's replay runs in a
buffer process, the task's job, id, worker and kind with a key both derive from the
cluster token (HMAC-SHA256; the key never travels, and a worker never holds the
token). A buffer process accepts a credential whose signature holds, for its own job,
until the coordinator tells it the task ended (`TaskGrants.revoke`).

    key = credential_key(cluster_token)
    credential = sign(key, TaskGrant(job_id, task_id, worker_id, "collect"))
    grant = verify(key, credential)          # None: forged or malformed
"""

from __future__ import annotations

import hashlib
import hmac
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

PREFIX = "bt1"
#: Ids as the coordinator makes them (`common.messages.new_id`): no dots.
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
KINDS = frozenset({"collect", "learn"})


@dataclass(frozen=True)
class TaskGrant:
    """What a credential lets its holder do: act for `task_id` of `job_id`, as
    `worker_id`, a task of `kind` (collect: insert; learn: sample, priorities)."""

    job_id: str
    task_id: str
    worker_id: str
    kind: str

    @property
    def role(self) -> str:
        return "collector" if self.kind == "collect" else "learner"


def credential_key(cluster_token: str) -> bytes:
    """The signing key: derived from the cluster token, so the coordinator and the
    buffer processes it starts share it without it ever being sent or stored."""
    return hmac.new(cluster_token.encode(), b"drover buffer task credentials", "sha256").digest()


def sign(key: bytes, grant: TaskGrant) -> str:
    fields = (grant.job_id, grant.task_id, grant.worker_id, grant.kind)
    if grant.kind not in KINDS or not all(_ID.match(f) for f in fields):
        raise ValueError(f"not a grant a credential can carry: {grant}")
    body = ".".join((PREFIX, *fields))
    return f"{body}.{_mac(key, body)}"


def verify(key: bytes, credential: str) -> TaskGrant | None:
    """The grant a credential carries, or None when it is not one this key signed."""
    parts = credential.split(".")
    if len(parts) != 6 or parts[0] != PREFIX:
        return None
    body, mac = credential.rpartition(".")[0], parts[5]
    if not hmac.compare_digest(mac.encode(), _mac(key, body).encode()):
        return None
    _, job_id, task_id, worker_id, kind, _ = parts
    if kind not in KINDS:
        return None
    return TaskGrant(job_id, task_id, worker_id, kind)


def _mac(key: bytes, body: str) -> str:
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


class TaskGrants:
    """The grants of a buffer process's job: which tasks ended (revoked), remembered
    for the last `kept` of them, so a late request of a task that ended is refused."""

    def __init__(self, key: bytes, job_id: str, *, kept: int = 100_000) -> None:
        self._key = key
        self.job_id = job_id
        self._kept = kept
        self._revoked: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def grant(self, credential: str) -> TaskGrant | None:
        """The credential's grant if it is for this job and its task has not ended."""
        grant = verify(self._key, credential)
        if grant is None or grant.job_id != self.job_id:
            return None
        with self._lock:
            if grant.task_id in self._revoked:
                return None
        return grant

    def revoke(self, task_ids: list[str]) -> None:
        with self._lock:
            for task_id in task_ids:
                self._revoked[task_id] = None
                self._revoked.move_to_end(task_id)
            while len(self._revoked) > self._kept:
                self._revoked.popitem(last=False)

    def revoked(self, task_id: str) -> bool:
        with self._lock:
            return task_id in self._revoked
