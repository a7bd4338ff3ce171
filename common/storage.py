"""The shared-store layer: the only code that touches the shared root.

Layout under the root (ARCHITECTURE §3)::

    <job_id>/job.json
    <job_id>/segments/<worker_id>/<seq>.safetensors
    <job_id>/policies/<version>.safetensors, latest.json, best.json
    <job_id>/checkpoints/learner-<iter>.pt
    <job_id>/eval/

Every path in a message is relative to the root and goes through `resolve`, which
refuses absolute paths, `..`, and symlinks that lead outside the root. Every write is
atomic (temp file in the same folder, fsync, `os.replace`), so a reader sees a whole
file or none. Arrays are stored with safetensors and records as JSON: no pickle.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

# Names we create ourselves: ids and numbers only, so a path is always easy to check.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class PathError(ValueError):
    """A path from a message is not a plain relative path inside the shared root."""


class CorruptFileError(ValueError):
    """A file exists but cannot be decoded (truncated, wrong format)."""


@dataclass(frozen=True)
class PolicyFile:
    version: int
    train_iter: int
    algo: str
    tensors: dict[str, np.ndarray]


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
        pure = PurePosixPath(rel)
        if pure.is_absolute() or ".." in pure.parts or str(pure) != rel:
            raise PathError(f"path {rel!r} must be relative, normalized and without '..'")
        if under is not None and pure.parts[: len(PurePosixPath(under).parts)] != (
            PurePosixPath(under).parts
        ):
            raise PathError(f"path {rel!r} is outside {under!r}")
        full = self.root / pure
        # A symlink inside the tree could still point outside it.
        real = Path(os.path.realpath(full))
        if real != self.root and self.root not in real.parents:
            raise PathError(f"path {rel!r} leads outside the shared root")
        return full

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
    def checkpoint_path(job_id: str, train_iter: int) -> str:
        return f"{check_name(job_id, 'job id')}/checkpoints/learner-{train_iter:010d}.pt"

    # --- bytes and JSON -------------------------------------------------------------

    def write_bytes(self, rel: str, data: bytes) -> Path:
        """Write atomically: a temp file in the same folder, fsync, then rename."""
        target = self.resolve(rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    def read_bytes(self, rel: str) -> bytes:
        return self.resolve(rel).read_bytes()

    def write_json(self, rel: str, record: Any) -> Path:
        return self.write_bytes(rel, json.dumps(record, indent=1, sort_keys=True).encode())

    def read_json(self, rel: str) -> Any:
        try:
            return json.loads(self.read_bytes(rel))
        except json.JSONDecodeError as exc:
            raise CorruptFileError(f"{rel}: not valid JSON ({exc})") from None

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
        lengths = {len(v) for v in columns.values()}
        if len(lengths) != 1:
            raise ValueError(f"segment columns differ in length: {sorted(lengths)}")
        metadata = {"drover": json.dumps(header)} if header is not None else None
        data = st_save({k: np.ascontiguousarray(v) for k, v in columns.items()}, metadata)
        self.write_bytes(rel, data)
        return len(data)

    def read_segment_header(self, rel: str) -> dict[str, Any] | None:
        """The JSON record a segment was written with, reading only the file's header."""
        with self.resolve(rel).open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size < 1 << 24:
                raise CorruptFileError(f"{rel}: bad header size {size}")
            try:
                header = json.loads(f.read(size))
                record = header.get("__metadata__", {}).get("drover")
                return json.loads(record) if record is not None else None
            except (ValueError, AttributeError) as exc:
                raise CorruptFileError(f"{rel}: unreadable header ({exc})") from None

    def age_s(self, rel: str) -> float:
        """Seconds since the file was last written."""
        return time.time() - self.resolve(rel).stat().st_mtime

    def read_segment(self, rel: str) -> dict[str, np.ndarray]:
        data = self.read_bytes(rel)
        try:
            return st_load(data)
        except (SafetensorError, ValueError) as exc:
            raise CorruptFileError(f"{rel}: not a valid segment ({exc})") from None

    # --- policies -------------------------------------------------------------------

    def write_policy(
        self, job_id: str, version: int, train_iter: int, algo: str, tensors: dict[str, np.ndarray]
    ) -> tuple[str, str]:
        """Write an immutable policy version; returns (path, sha256 of the file)."""
        rel = self.policy_path(job_id, version)
        meta = {"version": str(version), "train_iter": str(train_iter), "algo": algo}
        data = st_save({k: np.ascontiguousarray(v) for k, v in tensors.items()}, metadata=meta)
        self.write_bytes(rel, data)
        return rel, sha256_hex(data)

    def read_policy(self, rel: str, *, sha256: str | None = None) -> PolicyFile:
        """Read a policy version, checking its digest when one is given."""
        data = self.read_bytes(rel)
        if sha256 is not None and sha256_hex(data) != sha256:
            raise CorruptFileError(f"{rel}: sha256 does not match the announced one")
        try:
            tensors = st_load(data)
            header_len = int.from_bytes(data[:8], "little")
            meta = json.loads(data[8 : 8 + header_len]).get("__metadata__", {})
            return PolicyFile(
                version=int(meta["version"]),
                train_iter=int(meta["train_iter"]),
                algo=str(meta["algo"]),
                tensors=tensors,
            )
        except (SafetensorError, ValueError, KeyError) as exc:
            raise CorruptFileError(f"{rel}: not a valid policy file ({exc})") from None
