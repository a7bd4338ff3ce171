import os
import threading

import numpy as np
import pytest

from common.storage import CorruptFileError, PathError, SharedStore


@pytest.fixture
def store(tmp_path):
    return SharedStore(tmp_path / "root")


@pytest.mark.parametrize(
    "bad",
    ["", "/etc/passwd", "../x", "a/../../x", "a/./b", "a//b", "a/b/", "a\\b", "a\x00b", "./a"],
)
def test_resolve_refuses_paths_outside_or_not_normalized(store, bad):
    with pytest.raises(PathError):
        store.resolve(bad)


def test_resolve_refuses_symlink_that_leaves_the_root(store, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("x")
    (store.root / "job").mkdir()
    os.symlink(outside, store.root / "job" / "link")
    with pytest.raises(PathError, match="outside the shared root"):
        store.resolve("job/link/secret")


def test_resolve_under_a_folder(store):
    assert store.resolve("job-1/segments/w/1.safetensors", under="job-1/segments")
    with pytest.raises(PathError, match="outside"):
        store.resolve("job-2/segments/w/1.safetensors", under="job-1/segments")
    with pytest.raises(PathError, match="outside"):
        store.resolve("job-1/policies/1.safetensors", under="job-1/segments")


def test_atomic_write_leaves_whole_file_or_old_one(store, monkeypatch):
    store.write_bytes("j/a.bin", b"old")

    def failing_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="disk full"):
        store.write_bytes("j/a.bin", b"new" * 1000)
    monkeypatch.undo()
    assert store.read_bytes("j/a.bin") == b"old"
    assert store.list_dir("j") == ["a.bin"]  # no temp file left behind


def test_concurrent_readers_never_see_partial_files(store):
    payloads = [bytes([i]) * 200_000 for i in range(8)]
    store.write_bytes("j/f", payloads[0])
    stop = threading.Event()
    seen_bad = []

    def reader():
        while not stop.is_set():
            data = store.read_bytes("j/f")
            if data not in payloads:
                seen_bad.append(len(data))

    t = threading.Thread(target=reader)
    t.start()
    for i in range(200):
        store.write_bytes("j/f", payloads[i % len(payloads)])
    stop.set()
    t.join(5)
    assert seen_bad == []


def test_segment_round_trip_and_corruption(store):
    cols = {"obs": np.arange(12, dtype=np.float32).reshape(3, 4), "action": np.array([0, 1, 1])}
    store.write_segment("j/segments/w/00000000.safetensors", cols)
    back = store.read_segment("j/segments/w/00000000.safetensors")
    np.testing.assert_array_equal(back["obs"], cols["obs"])
    np.testing.assert_array_equal(back["action"], cols["action"])
    data = store.read_bytes("j/segments/w/00000000.safetensors")
    store.write_bytes("j/segments/w/00000001.safetensors", data[: len(data) // 2])
    with pytest.raises(CorruptFileError):
        store.read_segment("j/segments/w/00000001.safetensors")
    with pytest.raises(ValueError, match="differ in length"):
        store.write_segment("j/x", {"a": np.zeros(2), "b": np.zeros(3)})


def test_policy_round_trip_checks_digest(store):
    tensors = {"w": np.ones((2, 2), dtype=np.float32)}
    path, sha = store.write_policy("job-1", 3, 120, "dqn", tensors)
    assert path == "job-1/policies/00000003.safetensors"
    policy = store.read_policy(path, sha256=sha)
    assert (policy.version, policy.train_iter, policy.algo) == (3, 120, "dqn")
    np.testing.assert_array_equal(policy.tensors["w"], tensors["w"])
    with pytest.raises(CorruptFileError, match="sha256"):
        store.read_policy(path, sha256="0" * 64)


def test_names_are_checked(store):
    with pytest.raises(PathError):
        store.segment_path("../job", "w", 1)
    with pytest.raises(PathError):
        store.policy_path("job/x", 1)
