"""What is routine when services start and stop together is logged as info, not as a
warning: a slave's unanswered registration in its first STARTUP_QUIET_S (a warning
after), urllib3's warning at each connection retry (kept at debug level), and a
learner's last priorities refused because its job has ended."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from common.errors import ApiError
from common.http_client import ServiceUnavailable
from common.logs import RetriesAsDebug
from drover.local import free_port
from services.coordinator.client import CoordinatorClient
from services.learner.sampling import Outbox, Sampler
from services.slave import core as slave_core
from services.slave.core import Slave
from tests.fakes import BlockingRunner


def unanswered_slave(tmp_path) -> Slave:
    # free_port is bound and let go: nothing listens there
    client = CoordinatorClient(f"http://127.0.0.1:{free_port()}", "token", timeout_s=1.0)
    return Slave(
        role="collector",
        runner=BlockingRunner(),
        coordinator=client,
        advertise_url="http://127.0.0.1:1",
        shared_root=tmp_path,
    )


def records_while_unanswered(slave: Slave, caplog, seconds: float) -> list[logging.LogRecord]:
    caplog.set_level(logging.INFO)
    slave.start()
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not any(
            r.name == "services.slave.core" for r in caplog.records
        ):
            time.sleep(0.05)
    finally:
        slave.close(timeout_s=2.0)
    return [r for r in caplog.records if r.name == "services.slave.core"]


def test_a_slave_waiting_for_a_starting_coordinator_logs_info_not_warnings(tmp_path, caplog):
    records = records_while_unanswered(unanswered_slave(tmp_path), caplog, 10.0)
    waiting = [
        r for r in records if "waiting for the coordinator at http://127.0.0.1:" in r.getMessage()
    ]
    assert waiting and all(r.levelno == logging.INFO for r in waiting)
    assert not [r for r in records if r.levelno >= logging.WARNING]


def test_past_the_start_an_unreachable_coordinator_is_a_warning(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(slave_core, "STARTUP_QUIET_S", 0.0)
    records = records_while_unanswered(unanswered_slave(tmp_path), caplog, 10.0)
    assert any(
        r.levelno == logging.WARNING and "coordinator unreachable" in r.getMessage()
        for r in records
    )


def urllib3_record(message: str, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord("urllib3.connectionpool", level, __file__, 1, message, (), None)


@pytest.mark.parametrize(("root_level", "kept"), [(logging.INFO, False), (logging.DEBUG, True)])
def test_urllib3_retry_warnings_are_kept_at_debug_level(root_level, kept):
    root = logging.getLogger()
    before = root.level
    root.setLevel(root_level)  # setLevel, not the attribute: it clears the loggers' caches
    try:
        record = urllib3_record("Retrying (Retry(total=2)) after connection broken by ...")
        assert RetriesAsDebug().filter(record) is kept
        assert record.levelname == "DEBUG"
    finally:
        root.setLevel(before)


def test_other_urllib3_warnings_stay_warnings():
    record = urllib3_record("Connection pool is full, discarding connection: 127.0.0.1")
    assert RetriesAsDebug().filter(record)
    assert record.levelno == logging.WARNING


class EndedJobCoordinator:
    """Refuses priority updates as the coordinator does once a job has ended, or as
    an unreachable one would."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def update_priorities(self, job_id, keys, priorities, *, task_id=None):
        raise self.error


@pytest.mark.parametrize(
    ("error", "level"),
    [
        (ApiError(409, "job_finished", "job job-1 is succeeded"), logging.INFO),
        (ApiError(500, "internal", "boom"), logging.WARNING),
        (ServiceUnavailable("POST http://127.0.0.1:1: refused"), logging.WARNING),
    ],
)
def test_last_priorities_refused_by_an_ended_job_are_routine(caplog, error, level):
    outbox = Outbox()
    outbox.add(None, [1, 2], [0.5, 0.25])
    sampler = Sampler(
        EndedJobCoordinator(error),  # type: ignore[arg-type]
        "job-1",
        "learn-1",
        outbox,
        sample_timeout_s=1.0,
        stop=threading.Event(),
    )
    caplog.set_level(logging.INFO)
    sampler.send_last_priorities()
    [record] = [r for r in caplog.records if "priority update failed" in r.getMessage()]
    assert record.levelno == level
