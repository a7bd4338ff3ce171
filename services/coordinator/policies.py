"""The policy pointer: each job's newest policy version, which versions stay on disk,
and a long-poll for collectors waiting on a newer version."""

from __future__ import annotations

import logging

from common.errors import ApiError, bad_request, conflict, not_found
from common.messages import EvaluateSpec, LearnSpec, PolicyRef, dump
from common.storage import CorruptFileError, SharedStore, WrongAlgorithm, sha256_hex
from common.storage_full import retry_while_full
from common.video import VIDEO_NAME
from services.coordinator.jobs import JobBook
from services.coordinator.lock import BoundedWaits
from services.coordinator.reserve import write_kept
from services.coordinator.state import CoordinatorState, Job
from services.coordinator.tasks import TaskBoard
from services.coordinator.workers import WorkerRegistry
from services.coordinator.workflows import workflow_of

log = logging.getLogger(__name__)

#: Learn lease epochs a restarted coordinator skips (`PolicyPointer.recover`).
RESTART_EPOCH_GAP = 1000
#: The file in a job's coordinator folder that holds the epoch a restart raised its
#: learn leases to (`PolicyPointer.recover`).
EPOCH_FLOOR = "epoch.json"


class PolicyPointer:
    def __init__(
        self, state: CoordinatorState, jobs: JobBook, tasks: TaskBoard, workers: WorkerRegistry
    ) -> None:
        self.state = state
        self.jobs = jobs
        self.tasks = tasks
        self.workers = workers
        #: Collectors waiting for a newer version (`latest`).
        self.polls = BoundedWaits(state.guard, state.limits.max_waiting_policy_polls)

    def announce(
        self, job_id: str, ref: PolicyRef, *, task_id: str | None = None, caller: str | None = None
    ) -> None:
        store, guard = self.state.store, self.state.guard
        expected = store.policy_path(job_id, ref.version)
        if ref.path != expected:
            raise bad_request("path", f"version {ref.version} must live at '{expected}'")
        if not store.resolve(ref.path).is_file():
            raise bad_request("path", f"no file at '{ref.path}'")
        with guard.changing():
            job = self.jobs.running(job_id)
            self.tasks.check_sender(job_id, task_id, "learn", caller)
            if task_id is not None:
                spec = self.tasks.active(task_id).spec
                epoch = spec.epoch if isinstance(spec, LearnSpec) else 0
                if ref.epoch != epoch or epoch < job.learner_epoch:
                    raise conflict(
                        "stale_epoch",
                        f"epoch {ref.epoch} is not the job's learn lease "
                        f"(epoch {job.learner_epoch})",
                    )
            if job.policy is not None and ref.version <= job.policy.version:
                raise conflict(
                    "stale_version",
                    f"version {ref.version} is not newer than {job.policy.version}",
                )
            job.policy = ref
            job.policy_versions.append(ref.version)
            if job.replay is not None:
                job.replay.set_learner_version(ref.version)
            self.jobs.count_train_iters(job, ref.train_iter)
            latest = f"{job_id}/policies/latest.json"
            guard.defer(lambda: store.write_json(latest, dump(ref)), latest_of=latest)
            self._prune(job)
            self.jobs.settle(job)
            guard.notify()

    def _prune(self, job: Job) -> None:
        """Keep the newest versions, the best one and those being evaluated."""
        store = self.state.store
        keep = set(job.policy_versions[-self.state.limits.keep_policies :])
        keep |= workflow_of(job.config).kept_versions(job)
        if job.best_eval is not None:
            keep.add(job.best_eval.policy_version)
        for task in self.tasks.of_job(job, "evaluate"):
            if isinstance(task.spec, EvaluateSpec):
                keep.add(task.spec.policy_version)
        for version in [v for v in job.policy_versions if v not in keep]:
            path = store.policy_path(job.job_id, version)
            self.state.guard.defer(lambda path=path: store.delete(path))
        job.policy_versions = [v for v in job.policy_versions if v in keep]

    def latest(
        self,
        job_id: str,
        *,
        caller: str | None = None,
        newer_than: int | None = None,
        timeout_s: float = 0.0,
    ) -> PolicyRef | None:
        """The job's newest policy version. With `newer_than`, wait up to `timeout_s`
        for a version past it (a collector between rounds waits on this instead of
        polling); past `max_waiting_policy_polls` waiting at once, answer at once."""
        state = self.state
        with state.guard.changing():
            job = self.jobs.get(job_id)
            if caller is not None and not any(
                state.tasks[t].job_id == job_id for t in self.workers.get(caller).task_ids
            ):
                raise ApiError(403, "forbidden", f"worker {caller} has no task in job {job_id}")
            if newer_than is not None:
                self.polls.wait_for(
                    lambda: (
                        state.closing
                        or not job.running
                        or (job.policy is not None and job.policy.version > newer_than)
                    ),
                    timeout_s,
                )
            return job.policy

    def path(self, job_id: str, version: int | None) -> str:
        """The file of a policy version (the latest by default)."""
        with self.state.guard.changing():
            job = self.jobs.get(job_id)
            if version is None:
                if job.policy is None:
                    raise not_found(f"a policy of job {job_id}")
                version = job.policy.version
        path = self.state.store.policy_path(job_id, version)
        if not self.state.store.resolve(path).is_file():
            raise not_found(f"policy version {version} of job {job_id}")
        return path

    def checkpoints(self, job_id: str) -> list[str]:
        """The job's checkpoint file names, oldest first."""
        self._kept(job_id)
        return self.state.store.checkpoints(job_id)

    def checkpoint_path(self, job_id: str, name: str) -> str:
        """The file of one of the job's checkpoints, by its name (only a checkpoint's
        name: nothing else under the job's folder is served)."""
        if name not in self.checkpoints(job_id):
            raise not_found(f"checkpoint {name} of job {job_id}")
        return f"{job_id}/checkpoints/{name}"

    def video_path(self, job_id: str, name: str) -> str:
        """One of the job's evaluation videos (only those: `eval-<version>.mp4|gif`)."""
        self._kept(job_id)
        path = f"{job_id}/videos/{name}"
        if not VIDEO_NAME.fullmatch(name) or not self.state.store.exists(path):
            raise not_found(f"video {name} of job {job_id}")
        return path

    def _kept(self, job_id: str) -> None:
        """404 for a job the coordinator does not keep."""
        with self.state.guard.changing():
            self.jobs.get(job_id)

    def recover(self, job: Job) -> None:
        """Point a restored job at its newest valid policy file (whole, and written by
        the job's algorithm and its newest learn lease the snapshot knew, or a later
        one), also one written after its snapshot (policy files are immutable and
        written atomically: a file is a whole version). Disk work: call before the
        job is published.

        Its learn lease epochs go on past every one handed out before, also those
        handed out after its last snapshot (far fewer than `RESTART_EPOCH_GAP`): a
        learner of before the restart keeps an epoch no later learner gets. The raised
        epoch is durable (`EPOCH_FLOOR`) before the job is published: a second restart
        before the next snapshot raises it again from there, never hands one out
        twice."""
        store = self.state.store
        stale_below = max(job.learner_epoch, read_epoch_floor(store, job.job_id))
        job.learner_epoch = stale_below + RESTART_EPOCH_GAP
        # A coordinator restarted while the volume is full waits for room (in the
        # reserve's, if it has some) rather than exit or hand out an epoch not durable.
        epoch = job.learner_epoch
        retry_while_full(
            lambda: write_kept(
                self.state.reserve, lambda: write_epoch_floor(store, job.job_id, epoch)
            ),
            grace_s=job.config.system.storage_grace_s,
            what=f"{job.job_id}'s learn lease epoch",
        )
        folder = f"{job.job_id}/policies"
        current = job.policy.version if job.policy else 0
        versions = sorted(
            (
                int(n.split(".")[0])
                for n in store.list_dir(folder)
                if n.endswith(".safetensors") and n.split(".")[0].isdigit()
            ),
            reverse=True,
        )
        for version in (v for v in versions if v > current):
            path = store.policy_path(job.job_id, version)
            try:
                data = store.read_bytes(path)
                policy = store.read_policy(path, algo=job.config.policy.type)
            except (OSError, CorruptFileError, WrongAlgorithm) as exc:
                log.warning("policy file %s unusable: %s", path, exc)
                continue
            if policy.epoch < stale_below:
                log.warning("policy file %s is of a stale learn lease: passed over", path)
                continue
            job.policy = PolicyRef(
                version=version,
                path=path,
                sha256=sha256_hex(data),
                train_iter=policy.train_iter,
                epoch=policy.epoch,
            )
            job.policy_versions.extend(v for v in sorted(versions) if v > current)
            self.jobs.count_train_iters(job, policy.train_iter)  # settled at the next pass
            if job.replay is not None:
                job.replay.set_learner_version(version)
            log.info("job %s: newest policy on disk is version %d", job.job_id, version)
            return


def epoch_floor_path(job_id: str) -> str:
    """Where a restored job's learn lease epoch is kept as it is raised (EPOCH_FLOOR)."""
    return f"{job_id}/coordinator/{EPOCH_FLOOR}"


def read_epoch_floor(store: SharedStore, job_id: str) -> int:
    """The epoch the job's last restart raised its learn leases to (0: none yet)."""
    path = epoch_floor_path(job_id)
    if not store.exists(path):
        return 0
    try:
        return int(store.read_json(path)["learner_epoch"])
    except (CorruptFileError, KeyError, TypeError, ValueError) as exc:
        # Cut short by a crash mid-write cannot happen (writes are atomic); a damaged
        # one says nothing: the snapshot's epoch and the gap still hold.
        log.warning("%s unreadable (%s): the snapshot's epoch is the floor", path, exc)
        return 0


def write_epoch_floor(store: SharedStore, job_id: str, epoch: int) -> None:
    store.write_json(epoch_floor_path(job_id), {"learner_epoch": epoch})
