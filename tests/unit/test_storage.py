import json
import os
import socket
import stat
import threading

import numpy as np
import pytest
from safetensors.numpy import save as st_save

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


SEGMENT = "j/segments/w/00000000.safetensors"


def make_fifo(store, rel):
    store.resolve(rel).parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(store.resolve(rel))


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "read", ["read_segment", "read_bytes", "segment_rows", "read_segment_header", "read_json"]
)
def test_a_fifo_in_a_files_place_is_refused_without_blocking(store, read):
    make_fifo(store, SEGMENT)
    with pytest.raises(CorruptFileError, match="not a regular file"):
        getattr(store, read)(SEGMENT)


def test_a_folder_in_a_files_place_is_refused(store):
    store.resolve(SEGMENT).mkdir(parents=True)
    with pytest.raises(CorruptFileError, match="not a regular file"):
        store.read_segment(SEGMENT)


READS = ["read_segment", "read_bytes", "segment_rows", "read_segment_header", "read_json"]


@pytest.mark.parametrize("read", READS)
def test_a_symlink_in_a_files_place_is_refused_even_inside_the_root(store, read):
    target = "j/segments/w/00000001.safetensors"
    store.write_segment(target, {"obs": np.zeros((2, 4), np.float32)}, header={})
    os.symlink(store.resolve(target), store.resolve(SEGMENT))
    with pytest.raises(CorruptFileError, match="is a symbolic link, not a regular file"):
        getattr(store, read)(SEGMENT)


def make_device(store, rel):
    store.resolve(rel).parent.mkdir(parents=True, exist_ok=True)
    try:  # the node of /dev/zero, which never ends
        os.mknod(store.resolve(rel), 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD")


def make_socket(store, rel):
    store.resolve(rel).parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(store.resolve(rel)))
    return sock


@pytest.mark.timeout(10)
@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("make", [make_device, make_socket], ids=["device", "socket"])
def test_a_device_or_a_socket_in_a_files_place_is_refused(store, read, make):
    made = make(store, SEGMENT)
    try:
        with pytest.raises(CorruptFileError, match="not a regular file"):
            getattr(store, read)(SEGMENT)
    finally:
        if made is not None:
            made.close()


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "read", ["read_segment", "read_bytes", "segment_rows", "read_segment_header", "read_policy"]
)
def test_a_huge_sparse_file_is_refused_without_reading_it(store, read):
    store.resolve(SEGMENT).parent.mkdir(parents=True)
    with open(store.resolve(SEGMENT), "wb") as f:
        f.truncate(1 << 40)  # 1 TiB apparent size, no blocks
    with pytest.raises(CorruptFileError, match=f"{1 << 40} bytes, over the limit of"):
        getattr(store, read)(SEGMENT)


def test_reads_take_a_size_limit(store):
    store.write_bytes("j/a.bin", b"x" * 100)
    assert store.read_bytes("j/a.bin", max_bytes=100) == b"x" * 100
    with pytest.raises(CorruptFileError, match="100 bytes, over the limit of 99"):
        store.read_bytes("j/a.bin", max_bytes=99)
    store.write_json("j/r.json", {"a": [1] * 50})
    with pytest.raises(CorruptFileError, match="over the limit"):
        store.read_json("j/r.json", max_bytes=10)
    with pytest.raises(FileNotFoundError):
        store.read_bytes("j/none.bin")


def test_deeply_nested_json_is_a_corrupt_file(store):
    store.write_bytes("j/deep.json", b"[" * 200_000)
    with pytest.raises(CorruptFileError, match="not valid JSON"):
        store.read_json("j/deep.json")


def test_segment_rows_reads_the_count_from_the_header(store):
    columns = {
        "obs": np.zeros((7, 4), np.float32),
        "action": np.zeros(7, np.int64),
        "done": np.zeros(7, bool),
        "half": np.zeros((7, 2, 3), np.float16),
    }
    store.write_segment(SEGMENT, columns, header={"rows": 7})
    assert store.segment_rows(SEGMENT) == 7
    assert store.read_segment_header(SEGMENT) == {"rows": 7}


def raw_file(header, data=b""):
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + data


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (st_save({"a": np.zeros((3, 2), np.float32), "b": np.zeros(4, np.int64)}), "differ"),
        (b"", "bad header size"),
        (b"\x05\x00", "bad header size"),
        ((1 << 40).to_bytes(8, "little") + b"{}", "bad header size"),
        (b"\x10\x00\x00\x00\x00\x00\x00\x00{broken json....", "unreadable header"),
        (raw_file([1, 2]), "not a JSON object"),
        (raw_file({}), "no tensor"),
        (raw_file({"__metadata__": {"drover": "{}"}}), "no tensor"),
        (
            raw_file({"a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}, b"\0" * 4),
            "shape",
        ),
        (
            raw_file({"a": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, b"\0" * 4),
            "shape",
        ),
        (raw_file({"a": {"dtype": "F32", "shape": [2]}}, b"\0" * 8), "lacks"),
        (
            raw_file({"a": {"dtype": "X9", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),
            "dtype",
        ),
        # a header that claims more rows than the file holds
        (
            raw_file({"a": {"dtype": "F32", "shape": [10**9], "data_offsets": [0, 4 * 10**9]}}),
            "fit",
        ),
        (
            raw_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 12),
            "cover",
        ),
        (
            raw_file(
                {
                    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                    "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                },
                b"\0" * 16,
            ),
            "overlap",
        ),
    ],
)
def test_segment_rows_refuses_headers_that_do_not_describe_the_file(store, data, match):
    store.write_bytes(SEGMENT, data)
    with pytest.raises(CorruptFileError, match=match):
        store.segment_rows(SEGMENT)


def test_segment_rows_reads_only_the_header(store, monkeypatch):
    store.write_segment(SEGMENT, {"obs": np.zeros((1000, 64), np.float32)})
    reads = []
    real_fdopen = os.fdopen

    def recording_fdopen(*args, **kwargs):
        f = real_fdopen(*args, **kwargs)
        real_read = f.read

        def read(n=-1):
            reads.append(n)
            return real_read(n)

        f.read = read
        return f

    monkeypatch.setattr(os, "fdopen", recording_fdopen)
    assert store.segment_rows(SEGMENT) == 1000
    assert reads and sum(reads) < 1000 and -1 not in reads


def test_segment_header_records_must_be_objects(store):
    store.write_bytes(SEGMENT, raw_file({"__metadata__": {"drover": "[1]"}}))
    with pytest.raises(CorruptFileError, match="not a JSON object"):
        store.read_segment_header(SEGMENT)
    store.write_bytes(SEGMENT, raw_file({"__metadata__": ["x"]}))
    with pytest.raises(CorruptFileError, match="unreadable header"):
        store.read_segment_header(SEGMENT)
