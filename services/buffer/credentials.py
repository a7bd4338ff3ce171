"""Task credentials: what lets a worker use a buffer process for one task of one job,
checked by the buffer process on every request without asking the coordinator.

The coordinator signs, for each collect or learn task whose job's replay runs in a
buffer process, the task's job, id, worker, kind and learn lease epoch, timestamped,
with a key both derive from the cluster token (itsdangerous's timed serializer,
HMAC-SHA256; the key never travels, and a worker never holds the token). It signs
them again for every heartbeat of the task's worker (`HeartbeatReply.credentials`), so
a credential ends three ways, with no list to replay:

- expired: older than `credential_ttl_s` (a task whose worker stopped heartbeating, or
  whose coordinator has been away that long);
- issued before its buffer process started: a restarted process (or a restarted
  coordinator's new one) refuses every credential it was not told of since, so the
  ended tasks of before its start are refused, and a live task's next heartbeat
  brings it one that is accepted (meanwhile its requests are answered 503, and
  retried);
- revoked: the coordinator tells the live process the tasks that end
  (`TaskGrants.revoke`); and a learn task's credential is refused once a later learn
  lease (a higher epoch) has been seen.

    key = credential_key(cluster_token)
    credential = sign(key, TaskGrant(job_id, task_id, worker_id, "collect"))
    grant = verify(key, credential, max_age_s=120)   # None: forged; raises Stale
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from itsdangerous import BadData, SignatureExpired, URLSafeTimedSerializer

#: What credentials are signed for (a key signs nothing else with this salt).
SALT = "drover buffer task credentials"
#: Ids as the coordinator makes them (`common.messages.new_id`): no dots.
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
KINDS = frozenset({"collect", "learn"})
#: How long a credential is taken after it was signed, unless told otherwise.
DEFAULT_TTL_S = 120.0


@dataclass(frozen=True)
class TaskGrant:
    """What a credential lets its holder do: act for `task_id` of `job_id`, as
    `worker_id`, a task of `kind` (collect: insert; learn: sample, priorities), under
    learn lease `epoch` (a learn task's; 0 for a collect task)."""

    job_id: str
    task_id: str
    worker_id: str
    kind: str
    epoch: int = 0

    @property
    def role(self) -> str:
        return "collector" if self.kind == "collect" else "learner"


class Stale(Exception):
    """A credential this key signed that is no longer accepted: expired, or issued
    before its buffer process started. Its task's next heartbeat renews it."""


def credential_key(cluster_token: str) -> bytes:
    """The signing key: derived from the cluster token, so the coordinator and the
    buffer processes it starts share it without it ever being sent or stored."""
    return hmac.new(cluster_token.encode(), SALT.encode(), "sha256").digest()


def _serializer(key: bytes) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(key, salt=SALT, signer_kwargs={"digest_method": hashlib.sha256})


def sign(key: bytes, grant: TaskGrant) -> str:
    """The grant as a credential, timestamped now."""
    fields = (grant.job_id, grant.task_id, grant.worker_id)
    if grant.kind not in KINDS or not all(_ID.match(f) for f in fields) or grant.epoch < 0:
        raise ValueError(f"not a grant a credential can carry: {grant}")
    return str(_serializer(key).dumps([*fields, grant.kind, grant.epoch]))


def verify(
    key: bytes,
    credential: str,
    *,
    max_age_s: float = DEFAULT_TTL_S,
    issued_after_s: float | None = None,
) -> TaskGrant | None:
    """The grant a credential carries; None when it is not one this key signed.

    Raises:
        Stale: signed by this key, but older than `max_age_s`, or issued in a second
            before that of `issued_after_s` (wall time; timestamps are whole seconds).
    """
    try:
        payload, issued = _serializer(key).loads(
            credential, max_age=max_age_s, return_timestamp=True
        )
    except SignatureExpired:
        raise Stale(f"issued more than {max_age_s:g} s ago") from None
    except BadData:
        return None
    if not (isinstance(payload, list) and len(payload) == 5):
        return None
    job_id, task_id, worker_id, kind, epoch = payload
    if not (
        all(isinstance(f, str) and _ID.match(f) for f in (job_id, task_id, worker_id))
        and kind in KINDS
        and isinstance(epoch, int)
    ):
        return None
    # Whole seconds: one issued in the second the process started is taken (a task
    # made with its job's new process); one ended in that second was revoked there.
    if issued_after_s is not None and issued.timestamp() < math.floor(issued_after_s):
        raise Stale("issued before this buffer process started")
    return TaskGrant(job_id, task_id, worker_id, kind, epoch)


class TaskGrants:
    """The grants of a buffer process's job: credentials issued since it started and
    younger than `ttl_s`, of tasks not revoked, of no learn lease older than the newest
    seen. Ended tasks are remembered for the last `kept` of them."""

    def __init__(
        self,
        key: bytes,
        job_id: str,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        started_s: float | None = None,
        kept: int = 100_000,
    ) -> None:
        self._key = key
        self.job_id = job_id
        self.ttl_s = ttl_s
        #: When this process started (wall time): credentials issued before are stale.
        self.started_s = time.time() if started_s is None else started_s
        self._kept = kept
        self._revoked: OrderedDict[str, None] = OrderedDict()
        #: The newest learn lease seen: an older one's credentials are refused.
        self._learn_epoch = 0
        self._lock = threading.Lock()

    def grant(self, credential: str) -> TaskGrant | None:
        """The credential's grant if it is for this job, of a live task.

        Raises:
            Stale: expired, or issued before this process started.
        """
        grant = verify(self._key, credential, max_age_s=self.ttl_s, issued_after_s=self.started_s)
        if grant is None or grant.job_id != self.job_id:
            return None
        with self._lock:
            if grant.task_id in self._revoked:
                return None
            if grant.kind == "learn":
                if grant.epoch < self._learn_epoch:
                    return None  # a later learn lease exists: this learner is fenced off
                self._learn_epoch = grant.epoch
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
