"""A coordinator snapshot is one cut of each job's record and buffer."""

import pytest

from common.storage import SharedStore
from services.coordinator.core import Coordinator, CoordinatorLimits
from tests.coordinator_app import (
    CONFIG,
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
    client,
    core,
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

    from common.process import SNAPSHOT_NICENESS, yield_to_requests

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
    client,
    core,
):
    job_id = submit(client)
    core.snapshot_jobs()  # an empty buffer: no segments yet
    again = restarted(tmp_path).jobs[job_id]
    assert again.phase == "running" and again.buffer.size == 0


def snapshot_files(core, job_id):
    return sorted(
        n for n in core.store.list_dir(f"{job_id}/coordinator") if n.endswith(".safetensors")
    )


def test_snapshots_write_what_changed_and_a_restart_reads_the_chain_back(
    tmp_path,
    client,
    core,
    monkeypatch,
):
    replay = {"replay_buffer_size": 1000, "min_size_to_sample": 20}
    job_id = submit(client, {**CONFIG, "policy": {"other": {"replay_buffer": replay}}})

    def insert(seqs):
        for seq in seqs:
            segment = write_segment(core, job_id, seq)
            resp = post(client, f"/api/v1/jobs/{job_id}/segments", {"segments": [segment]})
            assert resp.status_code == 200, resp.json

    insert(range(3))
    core.snapshot_jobs()
    (cut,) = snapshot_files(core, job_id)
    assert cut.startswith("buffer-")
    insert(range(3, 5))
    core.snapshot_jobs()
    insert(range(5, 6))
    core.snapshot_jobs()
    files = snapshot_files(core, job_id)
    assert files[0] == cut and [f.split("-")[0] for f in files[1:]] == ["delta", "delta"]
    # a delta holds what changed: two and one segments' items, not the buffer
    sizes = [core.store.resolve(f"{job_id}/coordinator/{f}").stat().st_size for f in files]
    assert sizes[1] < sizes[0] / 4 and sizes[2] < sizes[1]
    stats = core.buffer_stats(job_id)
    again = restarted(tmp_path)
    assert again.jobs[job_id].buffer.size == 60 and again.jobs[job_id].env_steps == 60
    assert again.buffer_stats(job_id) == stats

    # once the deltas add up to the cut's size, a new cut replaces the chain
    core.persistence.chains.compact_at = 0.0
    insert(range(6, 7))
    core.snapshot_jobs()
    (new_cut,) = snapshot_files(core, job_id)
    assert new_cut.startswith("buffer-") and new_cut != cut
    assert restarted(tmp_path).jobs[job_id].buffer.size == 70


def test_a_failed_delta_makes_the_next_snapshot_a_whole_cut(
    tmp_path,
    client,
    core,
    monkeypatch,
):
    job_id = submit(client)
    for seq in range(2):
        post(
            client,
            f"/api/v1/jobs/{job_id}/segments",
            {"segments": [write_segment(core, job_id, seq)]},
        )
    core.snapshot_jobs()
    post(client, f"/api/v1/jobs/{job_id}/segments", {"segments": [write_segment(core, job_id, 2)]})
    write_bytes = core.store.write_bytes

    def full_disk(rel, data):
        if "/delta-" in rel:
            raise OSError(28, "No space left on device")
        return write_bytes(rel, data)

    monkeypatch.setattr(core.store, "write_bytes", full_disk)
    with pytest.raises(OSError):
        core.snapshot_jobs()
    monkeypatch.setattr(core.store, "write_bytes", write_bytes)
    post(client, f"/api/v1/jobs/{job_id}/segments", {"segments": [write_segment(core, job_id, 3)]})
    core.snapshot_jobs()  # the changes the failed delta took are in this cut
    assert [f.split("-")[0] for f in snapshot_files(core, job_id)] == ["buffer"]
    # the cut alone (no segment file is indexed again on restore) holds every item
    from services.coordinator.snapshot import read_job_snapshot

    saved = read_job_snapshot(core.store, job_id)
    assert saved.deltas == [] and saved.record["env_steps"] == 40
    assert saved.cut[1]["table"]["size"] == 40
