"""The slave framework: what collectors and learners share: registration, heartbeats
and task threads (the `/v1` routes through which the coordinator assigns and cancels
tasks are in `app.py`).

A service supplies a `TaskRunner` (its core); `Slave` does the rest::

    slave = Slave(role="collector", runner=CollectorRunner(store), coordinator=client,
                  advertise_url="http://127.0.0.1:8100", shared_root=root)
    slave.start()          # registers, then heartbeats in a background thread
    ...                    # the coordinator POSTs /v1/tasks -> slave.assign(task)
    slave.close()          # stops tasks, leaves the coordinator
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter
from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception,
)

from common.errors import ApiError
from common.http_client import ServiceUnavailable, is_transient, retry_wait_s
from common.messages import (
    MAX_ABS_FLOAT,
    SlaveStatus,
    SlaveTask,
    TaskAssignment,
    TaskProgress,
)
from common.metrics import service_registry
from common.settings import SlaveSettings
from services.buffer.client import DataClient, data_client
from services.coordinator.client import CoordinatorClient

log = logging.getLogger(__name__)
T = TypeVar("T")
EXTENSION = "drover.slave"
#: How long a worker keeps trying to reach a restarting coordinator for one call that
#: must not be lost (a task's result, a learner's resume or publish).
REPORT_PATIENCE_S = 60.0
#: Seconds after a slave starts during which an unanswered registration is logged as
#: routine (info), not as a warning: the services of a deployment start together.
STARTUP_QUIET_S = 30.0
#: How often a released task's waits look for a cancel that would end them early.
RELEASED_POLL_S = 0.1


@dataclass
class TaskContext:
    """What a running task may use: its stop signals, progress, and the coordinator.

    A task ends two ways before its work is done. Cancelled (its job ended, or the
    coordinator forgot it): `stop` is set, and what is in flight is dropped. Released
    (its worker goes to another job): `stop` and `release` are set; its loops end as
    when cancelled, but what they finished is still handed in (a collector's queued
    segments uploaded, a learner's checkpoint written) and the task reports complete.
    """

    task: TaskAssignment
    worker_id: str
    coordinator: CoordinatorClient
    #: Where the task inserts or samples (`data_for`; None: a task that moves no data).
    data: DataClient | None
    metrics: CollectorRegistry
    stop: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    progress: dict[str, float] = field(default_factory=dict)
    #: Segment files this task had to skip; reported with the heartbeats.
    unusable_segments: set[str] = field(default_factory=set)
    #: Called with each fresh buffer credential its heartbeats bring (`renew`): what
    #: uses the task's data access elsewhere (a learner's feeder process).
    on_renew: list[Callable[[str], None]] = field(default_factory=list)

    def renew(self, credential: str) -> None:
        """A fresh credential for the task's buffer processes (each heartbeat brings
        one: they expire, and a restarted process takes only fresh ones)."""
        if self.data is not None:
            self.data.renew(credential)
        for renewed in list(self.on_renew):
            renewed(credential)

    def stopped(self) -> bool:
        """The task's loops end: it was cancelled or released."""
        return self.stop.is_set()

    def dropping(self) -> bool:
        """Stopped, and not released: what is in flight is dropped."""
        return self.stop.is_set() and not self.release.is_set()

    def pause(self, seconds: float) -> None:
        """Sleep up to `seconds`; at once when the task is dropping."""
        deadline = time.monotonic() + seconds
        while not self.dropping() and (left := deadline - time.monotonic()) > 0:
            # `stop` is set already for a released task: it cannot be waited on.
            if self.stop.wait(left) and self.release.is_set():
                time.sleep(min(left, RELEASED_POLL_S))


def data_for(task: TaskAssignment, coordinator: CoordinatorClient) -> DataClient | None:
    """Where a task inserts or samples: its job's buffer process (or, for a sharded
    buffer, its processes), with the credential for this task its spec carries; None
    for a task that moves no data (an evaluation)."""
    access = getattr(task.spec, "data", None)
    if access is None:
        return None
    return data_client(access.urls, access.credential, timeout_s=coordinator.timeout_s)


class TaskRunner(Protocol):
    """A slave's work. One task of each kind may run at a time.

    Usage::

        runner.kinds                     # e.g. {"collect", "evaluate"}
        result = runner.run(ctx)         # returns when done or when ctx.stop is set
    """

    kinds: frozenset[str]

    def run(self, ctx: TaskContext) -> dict[str, Any]:
        """Do the task; return its JSON-able result. Raise to fail it."""
        ...


class Slave:
    """Registers with the coordinator, heartbeats, and runs assigned tasks in threads."""

    def __init__(
        self,
        *,
        role: str,
        runner: TaskRunner,
        coordinator: CoordinatorClient,
        advertise_url: str | Callable[[], str],
        shared_root: Path,
        resources: dict[str, Any] | None = None,
        metrics: CollectorRegistry | None = None,
    ) -> None:
        """`advertise_url`: where the coordinator reaches this slave, or a function
        that looks it up at each registration; `metrics`: the service's registry, which
        its runner counts in too (a fresh `service_registry()` when None)."""
        self.role = role
        self.runner = runner
        self.coordinator = coordinator
        self.advertise_url = advertise_url
        self.shared_root = shared_root
        self.resources = resources or {}
        #: What the coordinator must send to this slave's routes: our own secret, so
        #: no credential of the coordinator's ever reaches whoever runs a "worker".
        self.slave_token = secrets.token_urlsafe(32)
        self.metrics = metrics if metrics is not None else service_registry()
        self._tasks_total = Counter(
            "drover_tasks_total",
            "Tasks by kind and outcome",
            ["kind", "outcome"],
            registry=self.metrics,
        )
        self._lock = threading.Lock()
        self._running: dict[str, tuple[TaskContext, threading.Thread]] = {}
        self._closed = threading.Event()
        self._worker_id: str | None = None
        self._registered = threading.Event()
        self._heartbeat_interval_s = 1.0
        self._started_s = time.monotonic()
        self._thread = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def close(self, *, timeout_s: float = 10.0) -> None:
        """Stop every task, leave the coordinator (its tasks are reassigned at once)."""
        self._closed.set()
        with self._lock:
            running = list(self._running.values())
        for ctx, _ in running:
            ctx.stop.set()
        deadline = time.monotonic() + timeout_s
        for _, thread in running:
            thread.join(max(0.0, deadline - time.monotonic()))
        worker_id = self._worker_id
        if worker_id is not None:
            try:
                self.coordinator.leave(worker_id)
            except (ApiError, ServiceUnavailable) as exc:
                log.info("could not leave the coordinator: %s", exc)
        self._thread.join(max(0.0, deadline - time.monotonic()))

    @property
    def worker_id(self) -> str | None:
        return self._worker_id

    def ready(self) -> tuple[bool, str]:
        if not self.shared_root.is_dir():
            return False, f"shared root {self.shared_root} is not mounted"
        if self._worker_id is None:
            return False, "not registered with the coordinator yet"
        return True, "ok"

    # --- tasks ----------------------------------------------------------------------

    def assign(self, task: TaskAssignment) -> None:
        """Start `task` in a thread. 409 if a task of its kind already runs."""
        if task.kind not in self.runner.kinds:
            raise ApiError(400, "invalid", f"kind: a {self.role} does not run '{task.kind}' tasks")
        # The coordinator may assign a task before our registration's answer arrived.
        self._registered.wait(timeout=2.0)
        with self._lock:
            worker_id = self._worker_id
            if self._closed.is_set() or worker_id is None:
                raise ApiError(503, "not_ready", f"this {self.role} is not registered")
            if task.task_id in self._running:
                return  # the same assignment again (a retried POST): already running
            busy = [t for t, (c, _) in self._running.items() if c.task.kind == task.kind]
            if busy:
                raise ApiError(409, "busy", f"already running {task.kind} task {busy[0]}")
            ctx = TaskContext(
                task=task,
                worker_id=worker_id,
                coordinator=self.coordinator,
                data=data_for(task, self.coordinator),
                metrics=self.metrics,
            )
            thread = threading.Thread(
                target=self._run, args=(ctx,), name=f"task-{task.task_id}", daemon=True
            )
            self._running[task.task_id] = (ctx, thread)
        thread.start()

    def cancel(self, task_id: str) -> bool:
        """Stop the task now, dropping what is in flight (a release turned into a
        cancel too). False when it does not run here."""
        with self._lock:
            entry = self._running.get(task_id)
        if entry is None:
            return False
        entry[0].release.clear()
        entry[0].stop.set()
        return True

    def release(self, task_id: str) -> bool:
        """End the task at its next safe point, what it did handed in; it then reports
        complete. False when it does not run here."""
        with self._lock:
            entry = self._running.get(task_id)
        if entry is None:
            return False
        ctx = entry[0]
        if not ctx.stopped():  # a cancelled task stays cancelled
            ctx.release.set()
            ctx.stop.set()
        return True

    def _run(self, ctx: TaskContext) -> None:
        task = ctx.task
        log.info("task %s (%s, job %s) started", task.task_id, task.kind, task.job_id)
        try:
            result = self.runner.run(ctx)
            if ctx.dropping():
                outcome = "cancelled"
            else:
                # Done, or released: what it did is handed in, and so is its result.
                outcome = "released" if ctx.stopped() else "completed"
                self._report(self.coordinator.complete_task, task.task_id, result)
        except Exception as exc:
            outcome = "failed"
            log.error("task %s failed:\n%s", task.task_id, traceback.format_exc())
            try:
                self._report(
                    self.coordinator.fail_task, task.task_id, f"{type(exc).__name__}: {exc}"
                )
            except (ApiError, ServiceUnavailable) as report_exc:
                log.warning("could not report the failure: %s", report_exc)
        finally:
            with self._lock:
                self._running.pop(task.task_id, None)
        self._tasks_total.labels(task.kind, outcome).inc()
        log.info("task %s %s", task.task_id, outcome)

    def _report(self, call: Callable[..., Any], *args: Any) -> None:
        """A task's result, sent again while the coordinator restarts."""
        patiently(self._closed, call, *args)

    def status(self) -> SlaveStatus:
        with self._lock:
            tasks = [
                SlaveTask(
                    task_id=t,
                    job_id=c.task.job_id,
                    kind=c.task.kind,
                    progress=reportable(c.progress),
                )
                for t, (c, _) in self._running.items()
            ]
        return SlaveStatus(role=self.role, worker_id=self._worker_id, tasks=tasks)

    # --- heartbeats -------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        while not self._closed.is_set():
            # A fresh Retrying per beat: the backoff starts small again after a success.
            retrying = Retrying(
                retry=retry_if_exception(is_transient),
                wait=retry_wait_s,
                stop=lambda _: self._closed.is_set(),
                sleep=self._closed.wait,
                before_sleep=self._log_beat_retry,
            )
            try:
                for attempt in retrying:
                    with attempt:
                        self._beat()
            except RetryError:
                return  # closed while the coordinator was unreachable
            except ApiError as exc:
                # A refusal that retrying cannot fix (a wrong token, say): keep the
                # process up and visible, and try again at the usual pace.
                log.error("the coordinator refuses this %s: %s", self.role, exc)
            self._closed.wait(self._heartbeat_interval_s)

    def _log_beat_retry(self, state: RetryCallState) -> None:
        # Services that start together (`drover run`, compose, a pod) register while
        # the coordinator may still be starting: routine, until the start has taken
        # longer than any start should.
        starting = time.monotonic() - self._started_s < STARTUP_QUIET_S
        if self._worker_id is None and starting:
            log.info(
                "waiting for the coordinator at %s to answer; attempt %d",
                self.coordinator.base_url,
                state.attempt_number,
            )
        else:
            _log_waiting(state)

    def _beat(self) -> None:
        if self._worker_id is None:
            self._register()
        else:
            self._heartbeat()

    def _register(self) -> None:
        url = self.advertise_url() if callable(self.advertise_url) else self.advertise_url
        reg = self.coordinator.register(
            self.role, url, self.resources, slave_token=self.slave_token
        )
        self._heartbeat_interval_s = reg.heartbeat_interval_s
        self.coordinator.credential = reg.credential
        self._worker_id = reg.worker_id
        self._registered.set()
        log.info("registered as %s", reg.worker_id)

    def _heartbeat(self) -> None:
        worker_id = self._worker_id
        assert worker_id is not None
        with self._lock:
            states = [
                TaskProgress(
                    task_id=t,
                    state="running",
                    progress=reportable(c.progress),
                    unusable_segments=sorted(c.unusable_segments)[:100],
                )
                for t, (c, _) in self._running.items()
            ]
        try:
            answer = self.coordinator.heartbeat(worker_id, states)
        except ApiError as exc:
            if exc.status not in (401, 404):
                raise
            # The coordinator forgot us, or our credential with us (a restart or an
            # expired lease): our tasks were handed to others, so drop them and
            # register afresh.
            log.warning("coordinator forgot worker %s; abandoning tasks", worker_id)
            with self._lock:
                self._worker_id = None
                self.coordinator.credential = None
                self._registered.clear()
                for ctx, _ in self._running.values():
                    ctx.stop.set()
            return
        for task_id in answer.cancel:
            if self.cancel(task_id):
                log.info("coordinator cancelled task %s", task_id)
        for task_id in answer.release:
            if self.release(task_id):
                log.info("coordinator released task %s", task_id)
        for task_id, credential in answer.credentials.items():
            with self._lock:
                entry = self._running.get(task_id)
            if entry is not None:
                entry[0].renew(credential)


def patiently(stop: threading.Event, call: Callable[..., T], *args: Any) -> T:
    """`call(*args)`, tried again while the coordinator is unreachable or restarting
    (jittered backoff, or its Retry-After), for at most `REPORT_PATIENCE_S` or until
    `stop` is set; then the last error is raised. For calls whose loss would cost a
    task: its result, a learner's resume or publish."""
    retrying = Retrying(
        retry=retry_if_exception(is_transient),
        wait=retry_wait_s,
        stop=lambda state: stop.is_set() or (state.seconds_since_start or 0.0) > REPORT_PATIENCE_S,
        sleep=stop.wait,
        before_sleep=_log_waiting,
        reraise=True,
    )
    return retrying(call, *args)


def _log_waiting(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome is not None else None
    # The coordinator may be starting or restarting: a worker outlives that.
    log.warning("coordinator unreachable (%s); attempt %d", exc, state.attempt_number)


def reportable(progress: dict[str, float]) -> dict[str, float]:
    """The progress values a heartbeat can carry: finite numbers within the bound the
    coordinator accepts (a NaN loss is left out, not a reason to lose the lease)."""
    return {
        k: float(v)
        for k, v in list(progress.items())[:64]
        if isinstance(v, int | float) and math.isfinite(v) and abs(v) <= MAX_ABS_FLOAT
    }


def build_slave(
    role: str,
    runner: TaskRunner,
    settings: SlaveSettings,
    *,
    resources: dict[str, Any],
    metrics: CollectorRegistry | None = None,
    slave_type: type[Slave] = Slave,
) -> Slave:
    """A slave for `role`, configured from its settings, that registers with
    `resources` (what its service has: `common.devices.local_resources()` asks torch,
    which the collector and learner load anyway and this framework need not) and
    counts in `metrics` (the registry its runner counts in); `slave_type`: a `Slave`
    that takes its tasks otherwise (a fault bench's double)."""
    return slave_type(
        role=role,
        runner=runner,
        coordinator=CoordinatorClient(
            settings.coordinator_url,
            settings.token,
            registration_token=settings.registration_token,
        ),
        advertise_url=settings.address_now,
        shared_root=Path(settings.shared_dir).resolve(),
        resources=resources,
        metrics=metrics,
    )
