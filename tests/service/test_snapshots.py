"""A job's buffer comes back after a coordinator restart: its buffer process snapshots
it as a chain of a cut and deltas (services/buffer/chain.py), and what was acknowledged
after the last snapshot is indexed again from its segment files."""

import pytest

from common.storage import SharedStore
from services.buffer import chain
from services.coordinator.core import CoordinatorLimits
from tests.buffer_hosts import buffer_of, crash, host_of, make_coordinator, read_reports
from tests.coordinator_app import (
    CONFIG,
    post,
    submit,
    write_segment,
)


def restarted(tmp_path):
    again = make_coordinator(SharedStore(tmp_path), CoordinatorLimits(max_buffer_items=1000))
    again.restore_jobs()
    return again


def inserted(client, core, job_id, seqs):
    for seq in seqs:
        segment = write_segment(core, job_id, seq, header=True)  # as collectors write
        resp = post(client, f"/api/v1/jobs/{job_id}/segments", {"segments": [segment]})
        assert resp.status_code == 200, resp.json
    read_reports(core)


def test_what_was_acknowledged_comes_back_counted_after_a_crash(tmp_path, client, core):
    job_id = submit(client)
    inserted(client, core, job_id, range(2))
    host_of(core, job_id).snapshot()
    inserted(client, core, job_id, range(2, 3))  # after the last snapshot
    crash(core)  # the coordinator and its buffer processes die: no last snapshot
    again = restarted(tmp_path)
    assert buffer_of(again, job_id).size == 30 and again.jobs[job_id].env_steps == 30


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


def test_a_job_snapshotted_before_its_first_insert_comes_back(tmp_path, client, core):
    job_id = submit(client)
    host_of(core, job_id).snapshot()  # an empty buffer: no segments yet
    crash(core)
    again = restarted(tmp_path)
    assert again.jobs[job_id].phase == "running" and buffer_of(again, job_id).size == 0


def snapshot_files(core, job_id):
    return sorted(
        n for n in core.store.list_dir(f"{job_id}/buffer-0") if n.endswith(".safetensors")
    )


def test_snapshots_write_what_changed_and_a_restart_reads_the_chain_back(tmp_path, client, core):
    replay = {"replay_buffer_size": 1000, "min_size_to_sample": 20}
    job_id = submit(client, {**CONFIG, "policy": {"other": {"replay_buffer": replay}}})
    host = host_of(core, job_id)
    inserted(client, core, job_id, range(3))
    host.snapshot()
    (cut,) = snapshot_files(core, job_id)
    assert cut.startswith("buffer-")
    inserted(client, core, job_id, range(3, 5))
    host.snapshot()
    inserted(client, core, job_id, range(5, 6))
    host.snapshot()
    files = snapshot_files(core, job_id)
    assert files[0] == cut and [f.split("-")[0] for f in files[1:]] == ["delta", "delta"]
    # a delta holds what changed: two and one segments' items, not the buffer
    sizes = [core.store.resolve(f"{job_id}/buffer-0/{f}").stat().st_size for f in files]
    assert sizes[1] < sizes[0] / 4 and sizes[2] < sizes[1]
    # once the deltas add up to the cut's size, a new cut replaces the chain
    host.chains.compact_at = 0.0
    inserted(client, core, job_id, range(6, 7))
    host.snapshot()
    (new_cut,) = snapshot_files(core, job_id)
    assert new_cut.startswith("buffer-") and new_cut != cut
    stats = core.buffer_stats(job_id)
    crash(core)
    again = restarted(tmp_path)
    assert buffer_of(again, job_id).size == 70 and again.jobs[job_id].env_steps == 70
    restored = again.buffer_stats(job_id)
    assert (restored.size, restored.inserts) == (stats.size, stats.inserts)


def test_a_failed_delta_makes_the_next_snapshot_a_whole_cut(client, core, monkeypatch):
    job_id = submit(client)
    host = host_of(core, job_id)
    inserted(client, core, job_id, range(2))
    host.snapshot()
    inserted(client, core, job_id, range(2, 3))
    write_bytes = host.chains.store.write_bytes

    def full_disk(rel, data):
        if "/delta-" in rel:
            raise OSError(28, "No space left on device")
        return write_bytes(rel, data)

    monkeypatch.setattr(host.chains.store, "write_bytes", full_disk)
    with pytest.raises(OSError):
        host.snapshot()
    monkeypatch.setattr(host.chains.store, "write_bytes", write_bytes)
    inserted(client, core, job_id, range(3, 4))
    host.snapshot()  # the changes the failed delta took are in this cut
    assert [f.split("-")[0] for f in snapshot_files(core, job_id)] == ["buffer"]
    # the cut alone (no segment file is indexed again on restore) holds every item
    saved = chain.read_chain(core.store, f"{job_id}/buffer-0")
    assert saved.deltas == [] and saved.record["env_steps"] == 40
    assert saved.cut[1]["table"]["size"] == 40
