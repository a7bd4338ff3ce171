"""The slow volume the slow-volume test runs a job on (tests/slow_volume.py): the
shared store works on it as on a local folder, its checks included, and its fsync and
read calls wait the latency asked for. Needs root and FUSE (skipped without them)."""

import os
import shutil
import time

import numpy as np
import pytest

from common.storage import CorruptFileError, SharedStore
from tests.slow_volume import set_latency, slow_volume

LATENCY_S = 0.05


@pytest.fixture
def volume(tmp_path):
    with slow_volume(tmp_path / "volume", tmp_path / "backing", LATENCY_S) as root:
        yield root
    assert not os.path.ismount(tmp_path / "volume")


def test_the_shared_store_works_on_it_and_its_files_land_in_the_backing_folder(volume, tmp_path):
    store = SharedStore(volume)
    store.write_json("job-1/job.json", {"a": 1})
    columns = {"obs": np.arange(40, dtype=np.float32).reshape(10, 4)}
    path = store.segment_path("job-1", "w1", 1)
    store.write_segment(path, columns, header={"rows": 10})
    assert store.read_json("job-1/job.json") == {"a": 1}
    assert store.segment_rows(path) == 10 and store.read_segment_header(path) == {"rows": 10}
    np.testing.assert_array_equal(store.read_segment(path)["obs"], columns["obs"])
    assert store.list_dir("job-1") == ["job.json", "segments"]  # no temp file left
    assert (tmp_path / "backing" / "job-1" / "job.json").is_file()
    assert shutil.disk_usage(volume).total > 0
    # What the store refuses in a file's place: a symbolic link, a FIFO.
    os.symlink("job.json", volume / "job-1" / "link.json")
    os.mkfifo(volume / "job-1" / "fifo.json")
    for name in ("link.json", "fifo.json"):
        with pytest.raises(CorruptFileError):
            store.read_json(f"job-1/{name}")
    # What else the services do there: append to logs, truncate, touch, link.
    log = volume / "job-1" / "a.log"
    for line in (b"one\n", b"two\n"):
        with open(log, "ab") as f:
            f.write(line)
    os.truncate(log, 4)
    os.utime(log, ns=(1_000_000_000, 2_000_000_000))
    os.link(log, volume / "job-1" / "b.log")
    assert (volume / "job-1" / "b.log").read_bytes() == b"one\n"
    assert os.stat(log).st_mtime_ns == 2_000_000_000
    with pytest.raises(FileExistsError):
        os.open(log, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # mkstemp's guarantee
    store.delete_tree("job-1")
    assert os.listdir(volume) == []


def test_its_fsync_and_read_calls_wait_the_latency(volume):
    # A lower bound only: each such call sleeps first, whatever the machine's load.
    store = SharedStore(volume)
    started = time.monotonic()
    store.write_bytes("f", b"x")  # one fsync
    written_s = time.monotonic() - started
    started = time.monotonic()
    assert store.read_bytes("f") == b"x"  # at least one read call
    read_s = time.monotonic() - started
    assert written_s >= LATENCY_S and read_s >= LATENCY_S


def test_its_latency_changes_while_it_serves_and_a_version_is_written_once(volume):
    store = SharedStore(volume)
    set_latency(volume, 0.3)
    started = time.monotonic()
    store.write_bytes("f", b"x", once=True)  # linked into place, as policy versions are
    assert time.monotonic() - started >= 0.3
    with pytest.raises(FileExistsError):
        store.write_bytes("f", b"y", once=True)
    set_latency(volume, 0.0)
    assert store.read_bytes("f") == b"x" and os.listdir(volume) == ["f"]
