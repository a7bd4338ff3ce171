"""How a learn task asks the coordinator for data: the `Sampler` makes one sample
request at a time, carrying what the task has to tell the buffer since the last one
(its `Outbox`: holds trained on, new priorities); `JobOver` when the coordinator says
the job or the task ended.

No torch here: the feeder process (services/learner/feeder.py) samples with this too.

Usage::

    outbox = Outbox()
    sampler = Sampler(ctx.coordinator, job_id, task_id, outbox, sample_timeout_s=5.0, stop=stop)
    reply = sampler.sample(batch_size=64, num_batches=8)   # None: no data in time
    outbox.add(reply.hold_id, keys, priorities)             # once trained on
    sampler.send_last_priorities()                          # when the task ends
"""

from __future__ import annotations

import logging
import threading

from common.errors import ApiError
from common.http_client import ServiceUnavailable
from common.messages import MAX_KEYS_PER_UPDATE, SampleReply
from services.buffer.client import DataClient

log = logging.getLogger(__name__)

#: How long a sampler waits after the coordinator could not be reached.
UNREACHABLE_WAIT_S = 1.0


class JobOver(Exception):
    """The job ended (or was forgotten): the task stops."""


class Outbox:
    """What the next sample request tells the coordinator, added to by whoever trains
    and taken by whoever requests (threads or, through the feeder, processes): holds
    (items of a fifo buffer kept for the task) trained on and not yet acknowledged, and
    new priorities of items trained on (sent with requests, not in requests of their
    own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holds: list[str] = []
        self._keys: list[int] = []
        self._values: list[float] = []

    def add(self, hold_id: str | None, keys: list[int], priorities: list[float]) -> None:
        with self._lock:
            if hold_id is not None:
                self._holds.append(hold_id)
            self._keys += keys
            self._values += priorities

    def take(self) -> tuple[list[str], list[int], list[float]]:
        """The holds to acknowledge and the priorities to send with one request: all
        the holds, and as many priorities as one request carries (the rest wait)."""
        with self._lock:
            holds, self._holds = self._holds, []
            keys = self._keys[:MAX_KEYS_PER_UPDATE]
            values = self._values[:MAX_KEYS_PER_UPDATE]
            del self._keys[:MAX_KEYS_PER_UPDATE]
            del self._values[:MAX_KEYS_PER_UPDATE]
        return holds, keys, values

    def give_back(self, holds: list[str], keys: list[int], values: list[float]) -> None:
        """Put what a request that failed carried back in front of what came since, to
        go with the next one (acknowledging a hold or setting a priority twice is
        harmless; losing them is not)."""
        with self._lock:
            self._holds[:0] = holds
            self._keys[:0] = keys
            self._values[:0] = values

    def take_priorities(self) -> tuple[list[int], list[float]]:
        """Every priority no request took."""
        with self._lock:
            keys, self._keys = self._keys, []
            values, self._values = self._values, []
        return keys, values


class Sampler:
    """One learn task's sample requests to the coordinator."""

    def __init__(
        self,
        coordinator: DataClient,
        job_id: str,
        task_id: str | None,
        outbox: Outbox,
        *,
        sample_timeout_s: float,
        stop: threading.Event,
    ) -> None:
        self.coordinator = coordinator
        self.job_id = job_id
        self.task_id = task_id
        self.outbox = outbox
        self.sample_timeout_s = sample_timeout_s
        self.stop = stop

    def sample(self, batch_size: int, num_batches: int) -> SampleReply | None:
        """One long-poll for data; None when there was none in time (or no coordinator).

        It acknowledges the holds trained on since the last request (items of a fifo
        buffer are held for the task until then, and go back to the buffer if the task
        ends first) and carries the priorities that wait in the outbox.

        Raises:
            JobOver: the job or the task ended.
        """
        acknowledge, keys, values = self.outbox.take()
        try:
            return self.coordinator.sample(
                self.job_id,
                batch_size=batch_size,
                num_batches=num_batches,
                timeout_s=self.sample_timeout_s,
                task_id=self.task_id,
                acknowledge=acknowledge,
                priority_keys=keys,
                priorities=values,
            )
        except ApiError as exc:
            if exc.status == 503:  # sample_timeout (counted by the coordinator), or a restart
                self.outbox.give_back(acknowledge, keys, values)  # say it again
                return None
            if exc.status in (401, 403, 404, 409):  # the job ended, or this task did
                raise JobOver(exc.message) from exc
            raise
        except ServiceUnavailable as exc:
            self.outbox.give_back(acknowledge, keys, values)
            log.warning("sampling failed (%s); retrying", exc)
            self.stop.wait(UNREACHABLE_WAIT_S)
            return None

    def send_last_priorities(self) -> None:
        """Send the priorities no request took (the task's last), best effort."""
        keys, values = self.outbox.take_priorities()
        for start in range(0, len(keys), MAX_KEYS_PER_UPDATE):
            try:
                self.coordinator.update_priorities(
                    self.job_id,
                    keys[start : start + MAX_KEYS_PER_UPDATE],
                    values[start : start + MAX_KEYS_PER_UPDATE],
                    task_id=self.task_id,
                )
            except (ApiError, ServiceUnavailable) as exc:
                # Stale priorities only make sampling a little less sharp: carry on.
                # A job that has ended has no buffer left to update: the usual case
                # when a task stops because its job reached its goal.
                ended = isinstance(exc, ApiError) and exc.code == "job_finished"
                log.log(
                    logging.INFO if ended else logging.WARNING, "priority update failed: %s", exc
                )
                return
