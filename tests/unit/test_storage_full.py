"""A write to a full volume is tried again until there is room, for up to its grace;
any other error is raised at once."""

import errno
import logging

import pytest

from common.storage_full import ROOM_WAIT_KEY, WriteFailures, retry_while_full


class Flaky:
    """Fails with `error` `times` times, then writes."""

    def __init__(self, error, times):
        self.error, self.times, self.calls = error, times, 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.times:
            raise OSError(self.error, "no")
        return "written"


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_volume_is_waited_out_and_said_once_a_minute(error, caplog):
    write, sleeps, full = Flaky(error, 5), [], []
    with caplog.at_level(logging.WARNING, logger="common.storage_full"):
        result = retry_while_full(
            write, grace_s=60, what="segment s", sleep=sleeps.append, on_full=lambda: full.append(1)
        )
    assert result == "written" and write.calls == 6 and len(full) == 5
    assert all(0 <= s <= 10 for s in sleeps) and len(sleeps) == 5
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2  # the first wait, and the write once it went through
    assert "no room for segment s" in said[0] and "written after" in said[1]


def test_another_error_is_raised_at_once():
    write = Flaky(errno.EACCES, 1)
    with pytest.raises(PermissionError):
        retry_while_full(write, grace_s=60, what="x", sleep=lambda s: None)
    assert write.calls == 1


def test_past_its_grace_or_once_stopped_the_full_volume_error_is_raised():
    with pytest.raises(OSError, match="no") as raised:
        retry_while_full(Flaky(errno.ENOSPC, 10**6), grace_s=0.05, what="x", sleep=lambda s: None)
    assert raised.value.errno == errno.ENOSPC
    write = Flaky(errno.ENOSPC, 10**6)
    with pytest.raises(OSError):
        retry_while_full(write, grace_s=60, what="x", stopped=lambda: True, sleep=lambda s: None)
    assert write.calls == 1


def test_state_writes_that_find_the_volume_full_are_said_once_a_minute(caplog):
    failures = WriteFailures(logging.getLogger("t"), "snapshot failed")
    with caplog.at_level(logging.WARNING, logger="t"):
        for _ in range(30):  # a snapshot every 2 s for a minute
            failures.report(OSError(errno.ENOSPC, "No space left on device"))
        failures.report(ValueError("a bug"))
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said[0][0] == "WARNING" and "no room" in said[0][1]
    assert said[1][0] == "ERROR" and said[1][1] == "snapshot failed"  # with its traceback
    assert len(said) == 2 and failures.full == 30


def test_a_task_waiting_for_room_says_so_in_its_progress_until_the_write_lands():
    progress: dict[str, float] = {}
    seen = []

    def write():
        seen.append(dict(progress))
        if len(seen) <= 3:
            raise OSError(errno.ENOSPC, "no")
        return "written"

    assert retry_while_full(write, grace_s=60, what="x", sleep=lambda s: None, progress=progress)
    assert ROOM_WAIT_KEY not in seen[0] and all(ROOM_WAIT_KEY in p for p in seen[1:])
    assert progress == {}  # said no more once written
    with pytest.raises(OSError):
        retry_while_full(
            Flaky(errno.ENOSPC, 10**6),
            grace_s=0.05,
            what="x",
            sleep=lambda s: None,
            progress=progress,
        )
    assert progress == {}  # nor once given up


def test_pointer_writes_land_newest_last_and_one_without_room_is_kept_until_one_lands(tmp_path):
    from services.coordinator.lock import ChangeLock

    guard, landed, full = ChangeLock(), [], [True]

    def writer(content):
        def write():
            if full[0]:
                raise OSError(errno.ENOSPC, "no room")
            landed.append(content)

        return write

    with guard.changing():
        guard.defer(writer("v1"), latest_of="latest.json")
    assert guard.latest.kept == 1 and landed == []  # no room: kept, not lost
    with guard.changing():
        guard.defer(writer("v2"), latest_of="latest.json")
    assert guard.latest.kept == 1  # the newest of the file, not both
    full[0] = False
    guard.retry_kept()
    assert landed == ["v2"] and guard.latest.kept == 0
    # An older write that comes late (its thread was slower) never lands after a newer.
    older, newer = guard.latest.number(), guard.latest.number()
    guard.latest.run("latest.json", newer, writer("v4"))
    guard.latest.run("latest.json", older, writer("v3"))
    assert landed == ["v2", "v4"]
