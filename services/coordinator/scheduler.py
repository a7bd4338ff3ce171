"""The scheduler thread: turns the core's plan into HTTP calls to the slaves.

Calls go through a thread pool so one slow or dead slave (each call has a timeout)
never holds up assignments to the others: the core plans at most one assignment at a
time per worker, and drops a worker that fails several in a row. Each call carries
the worker's own secret, never the cluster token.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from common.errors import ApiError
from common.http_client import ServiceUnavailable
from services.coordinator.core import Coordinator, Dispatch
from services.slave.client import SlaveClient

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, core: Coordinator, *, period_s: float = 0.5, threads: int = 32) -> None:
        self.core = core
        self.period_s = period_s
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dispatch")
        self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self.core.close()  # wakes the loop
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                for dispatch in self.core.plan():
                    self._pool.submit(self._send, dispatch)
            except Exception:
                log.exception("scheduling pass failed")
            self.core.wait_for_change(self.period_s)

    def _send(self, dispatch: Dispatch) -> None:
        client = SlaveClient(dispatch.url, dispatch.auth, timeout_s=5.0, connect_retries=1)
        try:
            if dispatch.task is not None:
                client.assign(dispatch.task)
                self.core.dispatched(dispatch.task.task_id)
            elif dispatch.cancel_task_id is not None:
                client.cancel(dispatch.cancel_task_id)
            elif dispatch.release_task_id is not None:
                client.release(dispatch.release_task_id)
        except (ApiError, ServiceUnavailable) as exc:
            if dispatch.task is not None:
                self.core.dispatch_failed(dispatch.task.task_id, str(exc))
            # A failed cancel or release is harmless: the next heartbeat answer says it
            # again (and a release not taken is cancelled after its grace).
        finally:
            client.close()
