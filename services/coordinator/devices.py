"""Which workers can run a job: by the device its policy trains and acts on, and, for a
learner group, by whether the job's batches split evenly over its ranks.

A job with `policy.cuda: true` (or `policy.device: cuda`) runs torch on CUDA in every
role its workflow uses (learners train on it, collectors act on it), so:

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
from common.devices import (
    cpu_setting,
    cuda_devices,
    device_key,
    device_setting,
    device_value,
    needs_cuda,
)
from common.errors import bad_request
from common.ranks import learner_ranks
from jobconfig.ranks import split_error
from services.coordinator.state import Worker


def can_run(worker: Worker, config: JobConfig) -> bool:
    """The worker has the device the job's policy runs on, and, a learner, ranks over
    which the job's batches split."""
    if needs_cuda(config.policy) and cuda_devices(worker.resources) == 0:
        return False
    return worker.role != "learner" or _split_error(worker, config) is None


def _split_error(worker: Worker, config: JobConfig) -> tuple[str, str] | None:
    """Why the job's batches do not split over the worker's ranks (config key,
    message); None when they do."""
    return split_error(config.policy, learner_ranks(worker.resources))


def refuse_unless_fits(config: JobConfig, roles: Iterable[str], workers: Iterable[Worker]) -> None:
    """Refuse a CUDA job when, for a role it needs, workers are registered and none
    of them reports a CUDA device.

    Raises:
        ApiError: 400 naming `config.policy.cuda` (or `config.policy.device`).
    """
    policy = config.policy
    workers = list(workers)
    errors = [_split_error(w, config) for w in workers if w.role == "learner"]
    if "learner" in roles and errors and all(errors):
        key, message = errors[0]
        raise bad_request(f"config.{key}", message)
    if not needs_cuda(policy):
        return
    for role in sorted(roles):
        of_role = [w for w in workers if w.role == role]
        if of_role and not any(cuda_devices(w.resources) > 0 for w in of_role):
            raise bad_request(
                f"config.{device_key(policy)}",
                f"{device_value(policy)} needs a {role} with CUDA, and none of the "
                f"{len(of_role)} registered {role}s has one; set {cpu_setting(policy)}, "
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
    if not needs_cuda(policy):
        return ""
    lacking = [
        role
        for role in sorted(roles)
        if not any(w.role == role and cuda_devices(w.resources) > 0 for w in workers)
    ]
    if not lacking:
        return ""
    return (
        f"waiting for a {' and a '.join(lacking)} with CUDA ({device_setting(policy)}): "
        f"no registered {' or '.join(lacking)} has one; set {cpu_setting(policy)} to run on CPU"
    )
