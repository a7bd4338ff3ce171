"""A coordinator snapshot is one cut of each job's record and buffer."""

from common.storage import SharedStore
from services.coordinator.core import Coordinator, CoordinatorLimits
from tests.service.test_coordinator_routes import (  # noqa: F401 (fixtures)
    client,
    core,
    post,
    submit,
    write_segment,
)


def restarted(tmp_path):
    again = Coordinator(SharedStore(tmp_path), CoordinatorLimits(max_buffer_items=1000))
    again.restore_jobs()
    return again


def test_an_insert_caught_between_buffer_and_count_is_counted_in_the_cut(
    tmp_path,
    client,  # noqa: F811
    core,  # noqa: F811
    monkeypatch,
):
    job_id = submit(client)
    real_account = core.data.account

    def account(job, refs):
        # The buffer has the insert's items; the job has not counted them yet: a
        # snapshot now must still agree with itself.
        core.snapshot_jobs()
        real_account(job, refs)

    monkeypatch.setattr(core.data, "account", account)
    for seq in range(3):
        assert (
            post(
                client,
                f"/api/v1/jobs/{job_id}/segments",
                {"segments": [write_segment(core, job_id, seq)]},
            ).status_code
            == 200
        )
    again = restarted(tmp_path).jobs[job_id]
    assert again.buffer.size == 30 and again.env_steps == 30


def test_the_snapshot_thread_yields_the_cores_to_requests():
    import os
    import threading

    from services.coordinator.snapshot import SNAPSHOT_NICENESS, yield_to_requests

    seen = {}

    def snapshot_thread():
        yield_to_requests()
        seen["it"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    thread = threading.Thread(target=snapshot_thread)
    thread.start()
    thread.join(timeout=5)
    assert seen["it"] == os.getpriority(os.PRIO_PROCESS, 0) + SNAPSHOT_NICENESS or seen["it"] == 19
    # only that thread: the one serving requests keeps its priority
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < seen["it"]


def test_a_job_snapshotted_before_its_first_insert_comes_back(
    tmp_path,
    client,  # noqa: F811
    core,  # noqa: F811
):
    job_id = submit(client)
    core.snapshot_jobs()  # an empty buffer: no segments yet
    again = restarted(tmp_path).jobs[job_id]
    assert again.phase == "running" and again.buffer.size == 0
