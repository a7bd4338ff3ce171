"""A slow shared volume for tests: a FUSE pass-through of a backing folder whose
every fsync and read call waits `latency_s` first, as on a loaded network file system.

    with slow_volume(tmp_path / "mount", tmp_path / "backing", latency_s=0.03) as root:
        ...  # root behaves like the backing folder, slowly

The file system runs in a child process (`python -m tests.slow_volume BACKING MOUNT
--latency-s X`), never in the test's own: a test that waits on the volume must not be
the one that answers it. Its loop is multithreaded, so a slow call holds up its caller
and not the whole volume (a slow NFS server also answers many calls at once).

The child unmounts the volume and exits when its standard input closes: when the
context manager ends, and also when the test process dies without ending it, so no
mount outlives the test run. A line `latency <seconds>` on its standard input changes
the latency while it serves (`set_latency`: a volume slow for a while). It needs
/dev/fuse, libfuse 2 (Debian's libfuse2, `make install-fuse`) and fusepy; the test is
skipped where one is missing. Mounting without fusermount needs root, as the tests
that mount a tmpfs do.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes.util
import errno
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from common.messages import JobStatus

ROOT = Path(__file__).resolve().parents[1]

#: The calls a slow volume slows by default: those a network file system makes wait
#: on the server. A write lands in the client's page cache and returns; fsync waits
#: for the server to have it, and a read of a file not cached asks the server.
SLOWED_CALLS = frozenset({"fsync", "read"})
#: Every call the pass-through may be told to slow (`--slow`).
SLOWABLE_CALLS = frozenset({"fsync", "read", "write", "flush", "create", "open", "rename"})
#: What libfuse says when it may not mount here: mount(2) refused (no CAP_SYS_ADMIN) and
#: no setuid fusermount to fall back on, or no usable /dev/fuse.
NOT_ALLOWED_TO_MOUNT = ("fusermount", "failed to open /dev/fuse", "device not found")
#: How long mounting may take before the test fails (the child imports fusepy first).
MOUNT_TIMEOUT_S = 15.0
#: How long the child has to unmount and exit once told to, before it is killed.
UNMOUNT_TIMEOUT_S = 10.0


@contextlib.contextmanager
def slow_volume(
    mount: Path,
    backing: Path,
    latency_s: float,
    *,
    slowed: frozenset[str] = SLOWED_CALLS,
    log_path: Path | None = None,
) -> Iterator[Path]:
    """`backing` mounted at `mount` for the block, each of the `slowed` calls waiting
    `latency_s` first; yields `mount`. The child's output goes to `log_path` (next to
    `mount` when None). Skips the test where FUSE cannot be used here."""
    import pytest

    unusable = fuse_unusable()
    if unusable is not None:
        pytest.skip(f"no FUSE here for a slow volume: {unusable}")
    mount.mkdir(parents=True, exist_ok=True)
    backing.mkdir(parents=True, exist_ok=True)
    log_path = log_path or mount.with_name(f"{mount.name}.log")
    command = [sys.executable, "-m", "tests.slow_volume", str(backing), str(mount)]
    command += ["--latency-s", str(latency_s), "--slow", ",".join(sorted(slowed))]
    # `tests` is importable from the checkout's root alone (it is not installed).
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    with open(log_path, "ab") as log:
        child = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": path},
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C of the test run is the test's to handle
        )
    try:
        _wait_for_mount(mount, child, log_path, pytest)
        _SERVING[mount.resolve()] = child
        yield mount
    finally:
        _SERVING.pop(mount.resolve(), None)
        _unmount(mount, child)


#: The child serving each mounted slow volume.
_SERVING: dict[Path, subprocess.Popen] = {}


def set_latency(mount: Path, latency_s: float) -> None:
    """Change the latency of the slow volume mounted at `mount`, from now on."""
    child = _SERVING[mount.resolve()]
    assert child.stdin is not None
    child.stdin.write(f"latency {latency_s}\n".encode())
    child.stdin.flush()


def fuse_unusable() -> str | None:
    """Why a FUSE file system cannot be mounted here, or None when it can be tried."""
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"/dev/fuse: {exc.strerror}"
    if ctypes.util.find_library("fuse") is None:
        return "libfuse 2 is not installed (Debian's libfuse2: make install-fuse)"
    try:
        import fuse  # noqa: F401 - only whether it imports
    except (ImportError, OSError) as exc:
        return f"fusepy cannot be imported: {exc}"
    return None


def _wait_for_mount(mount: Path, child: subprocess.Popen, log_path: Path, pytest: Any) -> None:
    deadline = time.monotonic() + MOUNT_TIMEOUT_S
    while not os.path.ismount(mount):
        if child.poll() is not None:
            said = log_path.read_text(errors="replace").strip()
            # libfuse says it may not mount here (no right to, and no fusermount to
            # ask): FUSE cannot be used. Anything else is a fault of the pass-through.
            if any(reason in said for reason in NOT_ALLOWED_TO_MOUNT):
                pytest.skip(f"cannot mount a FUSE file system here: {said[-500:]}")
            raise RuntimeError(f"the slow volume exited with {child.returncode}:\n{said}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{mount} was not mounted within {MOUNT_TIMEOUT_S}s")
        time.sleep(0.05)


def _unmount(mount: Path, child: subprocess.Popen) -> None:
    """Tell the child to unmount and exit (its stdin closes); kill it after
    `UNMOUNT_TIMEOUT_S`, and detach the mount here if it is still there."""
    with contextlib.suppress(OSError):
        child.stdin.close()  # type: ignore[union-attr]
    try:
        child.wait(UNMOUNT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(UNMOUNT_TIMEOUT_S)
    if os.path.ismount(mount):
        detach(mount)


def detach(mount: Path) -> None:
    """Unmount at once, lazily: what still holds files open there keeps them until it
    closes them. fusermount is not installed everywhere; as root, umount does it."""
    subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=10)


# --- a job on a slow volume --------------------------------------------------------------


#: The example's DQN without a goal (its learner sets the pace: samples_per_insert),
#: 1-step transitions, so a segment's rows are its env steps: a job of some 20 s here.
JOB: dict[str, Any] = {
    "env": {"stop_value": None, "n_evaluator_episode": 2},
    "policy": {"nstep": 1},
    "system": {"max_env_step": 8000},
}


def short_job() -> dict[str, Any]:
    """`JOB` over the example's config (examples/cartpole_dqn.yaml)."""
    import yaml

    from common.config import deep_merge

    return deep_merge(yaml.safe_load((ROOT / "examples" / "cartpole_dqn.yaml").read_text()), JOB)


@dataclass(frozen=True)
class VolumeRun:
    """What a job run on a volume ended with, as the test checks it."""

    status: JobStatus
    #: The job's buffer statistics at its end (`inserts`: acknowledged inserts).
    buffer: dict[str, Any]
    #: Workers the coordinator dropped for missing their heartbeats (any job's).
    lease_expiries: float
    #: Env steps over the job's wall time, from its submission to its end.
    env_steps_per_s: float


def run_job(run_dir: Path, job: dict[str, Any], *, timeout_s: float) -> VolumeRun:
    """Run `job` to its end on a local cluster (2 collectors, 1 learner, 3 s leases)
    whose shared root is `run_dir`. The cluster's imports are made here: the child
    that serves the volume imports fusepy alone."""
    from drover.local import LocalCluster
    from tests.helpers import FAST_LEASES, scrape, total, wait_for_end

    with LocalCluster(run_dir, num_collectors=2, extra_env=FAST_LEASES) as cluster:
        cluster.wait_for_workers()
        job_id = cluster.client.submit_job(job).job_id
        status = wait_for_end(cluster, job_id, timeout_s)
        buffer = cluster.client.buffer_stats(job_id)
        expiries = total(scrape(cluster.coordinator_url, cluster.token), "drover_lease_expiries")
    wall_s = (status.finished_at or time.time()) - status.started_at
    return VolumeRun(status, buffer, expiries, status.env_steps / max(wall_s, 1e-9))


# --- the file system (in the child) ----------------------------------------------------


def _operations_class() -> type:
    """The pass-through's class, made where fusepy is imported: in the child only (the
    import fails without libfuse, and a test module must still import this one)."""
    from fuse import FuseOSError, Operations

    class SlowPassthrough(Operations):
        """Every call goes to the same path under `backing`; the `slowed` ones wait
        `latency_s` first, in the FUSE thread that serves them.

        File handles are the backing files' descriptors. `raw_fi` is on, so a create
        sees its caller's flags (O_EXCL: mkstemp must not share a name).
        """

        use_ns = True  # times as nanoseconds (fusepy's float seconds are deprecated)

        def __init__(self, backing: Path, latency_s: float, slowed: frozenset[str]) -> None:
            self.backing = str(backing)
            self.latency_s = latency_s
            self.slowed = slowed

        def __call__(self, op: str, *args: Any) -> Any:
            if op in self.slowed and self.latency_s > 0:
                time.sleep(self.latency_s)
            # An OSError raised here (a missing file) is answered with its errno.
            return super().__call__(op, *args)

        def _path(self, path: str) -> str:
            return self.backing + path  # FUSE paths are absolute within the mount

        # --- names -------------------------------------------------------------------

        def access(self, path: str, amode: int) -> None:
            if not os.access(self._path(path), amode):
                raise FuseOSError(errno.EACCES)

        def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
            st = os.fstat(fh.fh) if fh else os.lstat(self._path(path))
            return {
                "st_mode": st.st_mode,
                "st_nlink": st.st_nlink,
                "st_uid": st.st_uid,
                "st_gid": st.st_gid,
                "st_size": st.st_size,
                "st_blocks": st.st_blocks,
                "st_atime": st.st_atime_ns,
                "st_mtime": st.st_mtime_ns,
                "st_ctime": st.st_ctime_ns,
            }

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *os.listdir(self._path(path))]

        def readlink(self, path: str) -> str:
            return os.readlink(self._path(path))

        def mkdir(self, path: str, mode: int) -> None:
            os.mkdir(self._path(path), mode)

        def rmdir(self, path: str) -> None:
            os.rmdir(self._path(path))

        def mknod(self, path: str, mode: int, dev: int) -> None:
            os.mknod(self._path(path), mode, dev)

        def unlink(self, path: str) -> None:
            os.unlink(self._path(path))

        def symlink(self, target: str, source: str) -> None:
            os.symlink(source, self._path(target))

        def link(self, target: str, source: str) -> None:
            os.link(self._path(source), self._path(target))

        def rename(self, old: str, new: str) -> None:
            os.rename(self._path(old), self._path(new))

        def chmod(self, path: str, mode: int) -> None:
            os.chmod(self._path(path), mode)

        def chown(self, path: str, uid: int, gid: int) -> None:
            os.chown(self._path(path), uid, gid)

        def truncate(self, path: str, length: int, fh: Any = None) -> None:
            if fh:
                os.ftruncate(fh.fh, length)
            else:
                os.truncate(self._path(path), length)

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> None:
            os.utime(self._path(path), ns=times)

        def statfs(self, path: str) -> dict[str, int]:
            st = os.statvfs(self._path(path))
            keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree")
            keys += ("f_files", "f_flag", "f_frsize", "f_namemax")
            return {key: getattr(st, key) for key in keys}

        # --- files ---------------------------------------------------------------------

        def create(self, path: str, mode: int, fi: Any) -> int:
            fi.fh = os.open(self._path(path), fi.flags, mode)
            return 0

        def open(self, path: str, fi: Any) -> int:
            # O_NONBLOCK and O_NOFOLLOW reach the backing file as the caller gave them.
            fi.fh = os.open(self._path(path), fi.flags)
            return 0

        def read(self, path: str, size: int, offset: int, fi: Any) -> bytes:
            return os.pread(fi.fh, size, offset)

        def write(self, path: str, data: bytes, offset: int, fi: Any) -> int:
            return os.pwrite(fi.fh, data, offset)

        def flush(self, path: str, fi: Any) -> None:
            pass  # the data went to the backing file at each write

        def fsync(self, path: str, datasync: int, fi: Any) -> None:
            if datasync:
                os.fdatasync(fi.fh)
            else:
                os.fsync(fi.fh)

        def release(self, path: str, fi: Any) -> None:
            os.close(fi.fh)

    return SlowPassthrough


def _follow_stdin(mount: str, operations: Any) -> None:
    """Take `latency <seconds>` lines from the parent; once it closed our stdin, or
    died, unmount and exit (os._exit: the FUSE loop in the main thread would not end
    while a process still holds a file there)."""
    for line in sys.stdin.buffer:
        command, _, value = line.decode().partition(" ")
        if command == "latency":
            operations.latency_s = float(value)
            print(f"latency now {operations.latency_s}s", flush=True)
    subprocess.run(["umount", "-l", mount], capture_output=True, timeout=10)
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backing", type=Path, help="the folder the volume mirrors")
    parser.add_argument("mount", type=Path, help="where it is mounted")
    parser.add_argument("--latency-s", type=float, default=0.0, help="added to each slowed call")
    parser.add_argument(
        "--slow",
        default=",".join(sorted(SLOWED_CALLS)),
        help=f"the calls slowed, comma-separated, of {', '.join(sorted(SLOWABLE_CALLS))}",
    )
    args = parser.parse_args(argv)
    slowed = frozenset(filter(None, args.slow.split(",")))
    if not slowed <= SLOWABLE_CALLS:
        parser.error(f"--slow: unknown calls {sorted(slowed - SLOWABLE_CALLS)}")
    from fuse import FUSE

    operations = _operations_class()(args.backing.resolve(), args.latency_s, slowed)
    threading.Thread(target=_follow_stdin, args=(str(args.mount), operations), daemon=True).start()
    print(f"serving {args.backing} at {args.mount}, {args.latency_s}s on {sorted(slowed)}")
    sys.stdout.flush()
    # Foreground (no daemon fork: the parent watches this process); nothreads off: one
    # thread per call in flight.
    try:
        FUSE(
            operations,
            str(args.mount),
            foreground=True,
            nothreads=False,
            raw_fi=True,
            fsname="slowvolume",
        )
    except RuntimeError as exc:  # libfuse printed why
        print(f"the volume was not served (libfuse: {exc})", flush=True)
        os._exit(1)
    # os._exit: a plain exit would wait for the stdin reader, which nothing ends.
    os._exit(0)


if __name__ == "__main__":
    main()
