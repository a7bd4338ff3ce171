"""Which workers can run a job: by the device its policy trains and acts on, and, for a
learner group, by whether the job's batches split evenly over its ranks.

A job with `policy.cuda: true` (or `policy.device: cuda`) trains on CUDA, so its
learners need a CUDA device; its collectors act on CUDA where they have one and on
CPU where not (`policy.collect.device: auto`), unless `policy.collect.device: cuda`
asks for CUDA collectors only (common/devices.py). For each role that needs CUDA:

- at submission, a role of which workers are registered but none reports CUDA refuses
  the job (400 naming the key): its tasks could only fail;
- a role with no worker registered yet lets the job wait: each pass offers its
  workflow only the workers that report CUDA (`can_run`), and its status says what
  it waits for (`waiting_reason`).

A learner group (common/ranks.py) trains each rank on an equal share of every batch:
a job whose `policy.learn.batch_size` (or PPO's `n_sample`) does not split over a
group's ranks is not given to that group, and is refused at submission when every
registered learner is such a group.
"""

from __future__ import annotations

from collections.abc import Iterable

from common.config import JobConfig
from common.devices import cuda_devices, role_device, role_needs_cuda
from common.errors import bad_request
from common.ranks import learner_ranks
from jobconfig.ranks import split_error
from services.coordinator.state import Worker


def can_run(worker: Worker, config: JobConfig) -> bool:
    """The worker has the device the job's policy runs on in its role, and, a learner,
    ranks over which the job's batches split."""
    if role_needs_cuda(config.policy, worker.role) and cuda_devices(worker.resources) == 0:
        return False
    return worker.role != "learner" or _split_error(worker, config) is None


def _split_error(worker: Worker, config: JobConfig) -> tuple[str, str] | None:
    """Why the job's batches do not split over the worker's ranks (config key,
    message); None when they do."""
    return split_error(config.policy, learner_ranks(worker.resources))


def refuse_unless_fits(config: JobConfig, roles: Iterable[str], workers: Iterable[Worker]) -> None:
    """Refuse a CUDA job when, for a role that needs CUDA in it, workers are registered
    and none of them reports a CUDA device.

    Raises:
        ApiError: 400 naming `config.policy.cuda` (or `config.policy.device`, or
            `config.policy.collect.device`).
    """
    policy = config.policy
    workers = list(workers)
    errors = [_split_error(w, config) for w in workers if w.role == "learner"]
    if "learner" in roles and errors and all(errors):
        key, message = errors[0]
        raise bad_request(f"config.{key}", message)
    for role in sorted(roles):
        if not role_needs_cuda(policy, role):
            continue
        of_role = [w for w in workers if w.role == role]
        if of_role and not any(cuda_devices(w.resources) > 0 for w in of_role):
            device = role_device(policy, role)
            raise bad_request(
                f"config.{device.key}",
                f"{device.value} needs a {role} with CUDA, and none of the "
                f"{len(of_role)} registered {role}s has one; set {device.lift}, "
                f"or start a {role} on a machine with CUDA",
            )


def waiting_reason(config: JobConfig, roles: Iterable[str], workers: Iterable[Worker]) -> str:
    """Why a running job gets no task in some role: no learner whose ranks split its
    batches, or, for a CUDA job, no worker with CUDA ("" when it waits for neither)."""
    policy = config.policy
    workers = list(workers)
    learners = [w for w in workers if w.role == "learner"]
    if "learner" in roles and learners and not any(can_run(w, config) for w in learners):
        errors = [error for w in learners if (error := _split_error(w, config))]
        if errors:
            key, message = errors[0]
            return f"waiting for a learner whose ranks split the job's batches: {key} {message}"
    lacking = [
        role
        for role in sorted(roles)
        if role_needs_cuda(policy, role)
        and not any(w.role == role and cuda_devices(w.resources) > 0 for w in workers)
    ]
    if not lacking:
        return ""
    devices = [role_device(policy, role) for role in lacking]
    settings = ", ".join(dict.fromkeys(f"{d.key}: {d.value}" for d in devices))
    lifts = " and ".join(dict.fromkeys(d.lift for d in devices))
    return (
        f"waiting for a {' and a '.join(lacking)} with CUDA ({settings}): "
        f"no registered {' or '.join(lacking)} has one; set {lifts} to run without one"
    )
