"""The shared-store layer: the only code that touches the shared root.

Layout under the root (docs/architecture.md)::

    <job_id>/job.json
    <job_id>/segments/<worker_id>.<task_id>/<seq>.safetensors   (a folder per collect task)
    <job_id>/policies/<version>.safetensors, latest.json, best.json
    <job_id>/checkpoints/learner-e<epoch>-<iter>.safetensors
    <job_id>/eval/

Every path in a message is relative to the root and goes through `resolve`, which
refuses absolute paths, `..`, and symlinks that lead outside the root. Every write is
atomic (temp file in the same folder, fsync, `os.replace`), so a reader sees a whole
file or none. Policy versions are written once (`write_bytes(..., once=True)`: linked
into place, never replacing a file): a learner whose lease was taken over cannot
overwrite a version its successor wrote (the fencing scheme: docs/architecture.md).
Arrays are stored with safetensors and records as JSON (a learner checkpoint is both:
common/checkpoint_file.py): no pickle.

Every read goes through one open that takes regular files only (a FIFO or a device
put in a file's place would block or never end, and a symbolic link is refused
without being followed: files here are written by `os.replace` or hard-linked, never
symbolically linked) and
refuses a file over a size limit before reading a byte of it (a sparse file can
claim any size).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from common.frames import POOL_PREFIX

# Names we create ourselves: ids and numbers only, so a path is always easy to check.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

#: Size limits of the files read, checked before reading. Any read: checkpoints and
#: the coordinator's buffer snapshot (about 64 bytes an item, 50M items at most).
MAX_READ_BYTES = 4 << 30
#: A segment file (step data).
MAX_SEGMENT_BYTES = 512 << 20
#: A policy version.
MAX_POLICY_BYTES = 1 << 30
#: A JSON record (job config, coordinator state, evaluation records).
MAX_JSON_BYTES = 64 << 20
#: A safetensors file's JSON header.
MAX_HEADER_BYTES = 16 << 20

#: A learner checkpoint's file name ends with this (common/checkpoint_file.py).
CHECKPOINT_SUFFIX = ".safetensors"
#: A checkpoint's name: the learn lease's epoch, then the train iteration, both
#: zero-padded so names sort as (epoch, train_iter). Names of before epochs
#: (`learner-<iter>`) read as epoch 0.
_CHECKPOINT_NAME = re.compile(r"^learner-(?:e(\d{1,12})-)?(\d{1,12})\.safetensors$")

#: Bytes per element of the safetensors dtypes a segment may hold.
_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip


class PathError(ValueError):
    """A path from a message is not a plain relative path inside the shared root."""


class CorruptFileError(ValueError):
    """A file exists but cannot be decoded (truncated, wrong format)."""


class WrongAlgorithm(ValueError):
    """A whole policy or checkpoint file written by another algorithm than the job's:
    its tensors would not fit the job's networks."""


def check_algorithm(rel: str, written_by: str, expected: str) -> None:
    """Refuse a file whose header names another algorithm than the job's.

    Raises:
        WrongAlgorithm: naming both algorithms and the file.
    """
    if written_by != expected:
        raise WrongAlgorithm(
            f"{rel} was written by algorithm '{written_by}', but this job's "
            f"policy.type is '{expected}'"
        )


@dataclass(frozen=True)
class PolicyFile:
    version: int
    train_iter: int
    algo: str
    tensors: dict[str, np.ndarray]
    #: The learn lease's epoch of the learner that wrote it (0: written before epochs).
    epoch: int = 0


def checkpoint_key(name: str) -> tuple[int, int] | None:
    """(epoch, train_iter) of a checkpoint file's name; None for any other name."""
    match = _CHECKPOINT_NAME.match(name)
    if match is None:
        return None
    return int(match.group(1) or 0), int(match.group(2))


def check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise PathError(f"{what} '{name}' must be 1-128 letters, digits, '.', '_' or '-'")
    return name


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class SharedStore:
    """Atomic files under one shared root, addressed by root-relative paths."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._root_str = str(self.root)
        self._root_prefix = self._root_str.rstrip("/") + "/"

    # --- paths --------------------------------------------------------------------

    def resolve(self, rel: str, *, under: str | None = None) -> Path:
        """The absolute path of `rel`, refused unless it stays inside the root.

        Args:
            rel: a path relative to the root, as carried in messages.
            under: when given, `rel` must also lie inside this root-relative folder
                (e.g. the job's folder).

        Raises:
            PathError: absolute, empty, non-normalized, `..`, or a symlink escape.
        """
        if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
            raise PathError(f"path {rel!r} must be a non-empty relative path")
        # Normalized means no empty, "." or ".." part and no leading or trailing slash
        # (string checks: this runs for every segment of every insert).
        parts = rel.split("/")
        if "" in parts or "." in parts or ".." in parts:
            raise PathError(f"path {rel!r} must be relative, normalized and without '..'")
        if under is not None and parts[: under.count("/") + 1] != under.split("/"):
            raise PathError(f"path {rel!r} is outside {under!r}")
        full = self._root_prefix + rel
        # A symlink inside the tree could still point outside it.
        real = os.path.realpath(full)
        if real != self._root_str and not real.startswith(self._root_prefix):
            raise PathError(f"path {rel!r} leads outside the shared root")
        return Path(full)

    @staticmethod
    def job_dir(job_id: str) -> str:
        return check_name(job_id, "job id")

    @staticmethod
    def segment_path(job_id: str, worker_id: str, seq: int) -> str:
        job, worker = check_name(job_id, "job id"), check_name(worker_id, "worker id")
        return f"{job}/segments/{worker}/{seq:08d}.safetensors"

    @staticmethod
    def policy_path(job_id: str, version: int) -> str:
        return f"{check_name(job_id, 'job id')}/policies/{version:08d}.safetensors"

    @staticmethod
    def checkpoint_path(job_id: str, train_iter: int, epoch: int = 0) -> str:
        name = f"learner-e{epoch:08d}-{train_iter:010d}{CHECKPOINT_SUFFIX}"
        return f"{check_name(job_id, 'job id')}/checkpoints/{name}"

    def checkpoints(self, job_id: str, *, up_to_epoch: int | None = None) -> list[str]:
        """The job's checkpoint file names, oldest first: by lease epoch, then train
        iteration, so a stale learner's late checkpoint never sorts past one its
        successor wrote; with `up_to_epoch`, those of that lease and earlier ones only."""
        names = self.list_dir(f"{check_name(job_id, 'job id')}/checkpoints")
        keyed = [(key, name) for name in names if (key := checkpoint_key(name)) is not None]
        if up_to_epoch is not None:
            keyed = [(key, name) for key, name in keyed if key[0] <= up_to_epoch]
        return [name for _, name in sorted(keyed)]

    # --- bytes and JSON -------------------------------------------------------------

    def write_bytes(self, rel: str, data: bytes, *, once: bool = False) -> Path:
        """Write atomically: a temp file in the same folder, fsync, then rename.

        `once`: the file is never replaced: the temp file is hard-linked into place,
        which fails when a file of that name exists (POSIX link(2) is atomic, NFS
        included), so of two writers of one name the first wins whole.

        Raises:
            FileExistsError: `once`, and `rel` exists.
        """
        return self._write_with(rel, lambda f: f.write(data), once=once)

    def copy(self, src: str, dst: str, *, once: bool = False) -> Path:
        """Copy the regular file `src` to `dst` as `write_bytes` writes (streamed, not
        read whole: a checkpoint can be large).

        Raises:
            CorruptFileError: `src` is not a regular file.
            FileExistsError: `once`, and `dst` exists.
        """
        with self._open_regular(src, MAX_READ_BYTES) as (source, _):
            return self._write_with(dst, lambda f: shutil.copyfileobj(source, f), once=once)

    def _write_with(self, rel: str, write: Callable[[BinaryIO], Any], *, once: bool) -> Path:
        target = self.resolve(rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            if once:
                os.link(tmp, target)
                os.unlink(tmp)
            else:
                os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    @contextlib.contextmanager
    def _open_regular(
        self, rel: str, max_bytes: int, under: str | None = None
    ) -> Iterator[tuple[BinaryIO, int]]:
        """The open file and its size: a regular file of at most `max_bytes`.

        Opened non-blocking, so a FIFO in a file's place is refused at once instead of
        waiting for a writer forever, and without following a symbolic link in its
        place (which could lead anywhere between `resolve` and this open); the type
        and size are checked on the opened descriptor, before anything is read.

        Raises:
            CorruptFileError: not a regular file (a FIFO, a device, a socket, a
                folder, a symbolic link), or over `max_bytes`.
            OSError: it cannot be opened (FileNotFoundError when it is not there).
        """
        try:
            fd = os.open(
                self.resolve(rel, under=under), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW
            )
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise CorruptFileError(f"{rel} is a symbolic link, not a regular file") from None
            if exc.errno == errno.ENXIO:  # a socket
                raise CorruptFileError(f"{rel} is not a regular file") from None
            raise
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise CorruptFileError(f"{rel} is not a regular file")
            if info.st_size > max_bytes:
                raise CorruptFileError(
                    f"{rel} is {info.st_size} bytes, over the limit of {max_bytes}"
                )
            f = os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        with f:
            yield f, info.st_size

    def read_bytes(self, rel: str, *, max_bytes: int = MAX_READ_BYTES) -> bytes:
        """The whole file, which must be a regular file of at most `max_bytes`.

        Raises:
            CorruptFileError: not a regular file, too big, or changed while being read.
        """
        with self._open_regular(rel, max_bytes) as (f, size):
            data = f.read(size)
            if len(data) != size or f.read(1):
                raise CorruptFileError(f"{rel} changed size while being read")
        return data

    def write_json(self, rel: str, record: Any) -> Path:
        return self.write_bytes(rel, json.dumps(record, indent=1, sort_keys=True).encode())

    def read_json(self, rel: str, *, max_bytes: int = MAX_JSON_BYTES) -> Any:
        data = self.read_bytes(rel, max_bytes=max_bytes)
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as exc:  # bad JSON, bad UTF-8, deep nesting
            raise CorruptFileError(f"{rel}: not valid JSON ({exc})") from None

    def append_line(self, rel: str, line: bytes) -> None:
        """Append `line` and a newline to a log file (made when missing), durable when
        this returns. A crash mid-append can leave its last line cut short: readers
        skip a line that does not parse."""
        target = self.resolve(rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, line + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)

    def exists(self, rel: str) -> bool:
        return self.resolve(rel).exists()

    def delete(self, rel: str) -> bool:
        """Remove one file; True when it existed."""
        try:
            self.resolve(rel).unlink()
            return True
        except FileNotFoundError:
            return False

    def delete_tree(self, rel: str) -> None:
        shutil.rmtree(self.resolve(rel), ignore_errors=True)

    def list_dir(self, rel: str) -> list[str]:
        """Names in a folder (no temp files), sorted; empty when it does not exist.
        `""` lists the root itself."""
        folder = self.root if rel == "" else self.resolve(rel)
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))

    # --- step data --------------------------------------------------------------------

    def write_segment(
        self, rel: str, columns: dict[str, np.ndarray], header: dict[str, Any] | None = None
    ) -> int:
        """Write a segment of equal-length column arrays; returns its size in bytes.

        Args:
            header: a JSON record kept in the file's metadata (the collector stores its
                `SegmentRef` there, so a coordinator can index a file it never heard of).
        """
        # A pool (`pool.*`, common/frames.py) is not rows.
        lengths = {len(v) for k, v in columns.items() if not k.startswith(POOL_PREFIX)}
        if len(lengths) != 1:
            raise ValueError(f"segment columns differ in length: {sorted(lengths)}")
        metadata = {"drover": json.dumps(header)} if header is not None else None
        data = st_save({k: np.ascontiguousarray(v) for k, v in columns.items()}, metadata)
        self.write_bytes(rel, data)
        return len(data)

    def read_segment_header(self, rel: str) -> dict[str, Any] | None:
        """The JSON record a segment was written with, reading only the file's header."""
        with self._open_regular(rel, MAX_SEGMENT_BYTES) as (f, size):
            header = _read_safetensors_header(f, rel, size)
        try:
            record = header.get("__metadata__", {}).get("drover")
            value = json.loads(record) if record is not None else None
        except (ValueError, AttributeError, TypeError, RecursionError) as exc:
            raise CorruptFileError(f"{rel}: unreadable header ({exc})") from None
        if value is not None and not isinstance(value, dict):
            raise CorruptFileError(f"{rel}: the header's record is not a JSON object")
        return value

    def segment_rows(self, rel: str, *, under: str | None = None) -> int:
        """The number of rows of a segment, from its header alone (a bounded read);
        `under` as in `resolve`.

        The header must describe a whole safetensors file: every tensor's byte range
        fits its dtype and shape, the ranges tile the data that follows the header,
        and all tensors have the same first dimension, which is the answer.

        Raises:
            CorruptFileError: not a regular file, over `MAX_SEGMENT_BYTES`, an absurd
                header size, an unreadable header, or tensors that disagree.
        """
        with self._open_regular(rel, MAX_SEGMENT_BYTES, under) as (f, size):
            header = _read_safetensors_header(f, rel, size)
            data_bytes = size - f.tell()
        return _rows_of(header, data_bytes, rel)

    def age_s(self, rel: str) -> float:
        """Seconds since the file was last written."""
        return time.time() - self.resolve(rel).stat().st_mtime

    def read_segment(self, rel: str) -> dict[str, np.ndarray]:
        data = self.read_bytes(rel, max_bytes=MAX_SEGMENT_BYTES)
        try:
            return st_load(data)
        except (SafetensorError, ValueError, TypeError, KeyError) as exc:  # KeyError: dtype
            raise CorruptFileError(f"{rel}: not a valid segment ({exc!r})") from None

    # --- policies -------------------------------------------------------------------

    def write_policy(
        self,
        job_id: str,
        version: int,
        train_iter: int,
        algo: str,
        tensors: dict[str, np.ndarray],
        *,
        epoch: int = 0,
    ) -> tuple[str, str]:
        """Write a policy version once (`epoch`: the writing learner's lease epoch);
        returns (path, sha256 of the file).

        Raises:
            FileExistsError: the version's file exists (another learner wrote it).
        """
        rel = self.policy_path(job_id, version)
        meta = {
            "version": str(version),
            "train_iter": str(train_iter),
            "algo": algo,
            "epoch": str(epoch),
        }
        data = st_save({k: np.ascontiguousarray(v) for k, v in tensors.items()}, metadata=meta)
        self.write_bytes(rel, data, once=True)
        return rel, sha256_hex(data)

    def read_policy(
        self, rel: str, *, sha256: str | None = None, algo: str | None = None
    ) -> PolicyFile:
        """Read a policy version, checking its digest when one is given, and that the
        job's algorithm `algo` wrote it when one is given.

        Raises:
            CorruptFileError: not a whole policy file, or not the announced digest.
            WrongAlgorithm: written by another algorithm than `algo`.
        """
        data = self.read_bytes(rel, max_bytes=MAX_POLICY_BYTES)
        if sha256 is not None and sha256_hex(data) != sha256:
            raise CorruptFileError(f"{rel}: sha256 does not match the announced one")
        try:
            tensors = st_load(data)
            header_len = int.from_bytes(data[:8], "little")
            meta = json.loads(data[8 : 8 + header_len]).get("__metadata__", {})
            policy = PolicyFile(
                version=int(meta["version"]),
                train_iter=int(meta["train_iter"]),
                algo=str(meta["algo"]),
                tensors=tensors,
                epoch=int(meta.get("epoch", 0)),
            )
        except (SafetensorError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptFileError(f"{rel}: not a valid policy file ({exc!r})") from None
        if algo is not None:
            check_algorithm(rel, policy.algo, algo)
        return policy


def _read_safetensors_header(f: BinaryIO, rel: str, size: int) -> dict[str, Any]:
    """The JSON header of an open safetensors file of `size` bytes; leaves `f` at the
    first data byte."""
    length = int.from_bytes(f.read(8), "little") if size >= 8 else 0
    if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
        raise CorruptFileError(f"{rel}: bad header size {length} in a file of {size} bytes")
    raw = f.read(length)
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise CorruptFileError(f"{rel}: unreadable header ({exc})") from None
    if len(raw) != length or not isinstance(header, dict):
        raise CorruptFileError(f"{rel}: unreadable header (not a JSON object)")
    return header


def _rows_of(header: dict[str, Any], data_bytes: int, rel: str) -> int:
    """The common first dimension of the tensors a safetensors header describes."""
    rows: set[int] = set()
    ranges: list[tuple[int, int]] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            shape, dtype, (start, end) = info["shape"], info["dtype"], info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise CorruptFileError(
                f"{rel}: tensor {name!r} lacks shape, dtype or offsets"
            ) from None
        # A pool (`pool.frames`, common/frames.py) is not rows: it is only checked to
        # fit the file.
        pool = isinstance(name, str) and name.startswith(POOL_PREFIX)
        if not (
            isinstance(shape, list)
            and shape
            and all(type(d) is int and d >= 0 for d in shape)  # not bool
        ):
            raise CorruptFileError(f"{rel}: tensor {name!r} has shape {shape!r}, not [rows, ...]")
        itemsize = _DTYPE_BYTES.get(dtype) if isinstance(dtype, str) else None
        if itemsize is None:
            raise CorruptFileError(f"{rel}: tensor {name!r} has an unknown dtype {dtype!r}")
        if not (
            type(start) is int
            and type(end) is int
            and 0 <= start <= end <= data_bytes
            and end - start == math.prod(shape) * itemsize
        ):
            raise CorruptFileError(f"{rel}: tensor {name!r} has offsets that do not fit it")
        if not pool:
            rows.add(shape[0])
        ranges.append((start, end))
    if not rows:
        raise CorruptFileError(f"{rel}: the segment holds no tensor")
    if len(rows) != 1:
        raise CorruptFileError(f"{rel}: tensors differ in rows: {sorted(rows)}")
    covered = 0
    for start, end in sorted(ranges):
        if start != covered:
            raise CorruptFileError(f"{rel}: tensors' byte ranges overlap or leave gaps")
        covered = end
    if covered != data_bytes:
        raise CorruptFileError(f"{rel}: tensors cover {covered} of {data_bytes} data bytes")
    return rows.pop()
