"""Where a learn task starts: `resume` loads the newest readable checkpoint of the
job into the learner, and the newest published policy's weights when that is newer;
`load_checkpoint` and `load_policy` read those files, for it and for a learner group's
other ranks, which load the same files as rank 0 (services/learner/aggregator.py).

A file another algorithm wrote, one that cannot be read, and one holding non-finite
weights are passed over.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from algorithms.base import Learner
from common.checkpoint_file import read_checkpoint
from common.errors import ApiError
from common.http_client import ServiceUnavailable
from common.messages import PolicyRef
from common.storage import CorruptFileError, SharedStore, WrongAlgorithm, checkpoint_key
from services.learner.guards import NonFiniteWeights, finite
from services.learner.sampling import JobOver
from services.slave.core import TaskContext, patiently

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resumed:
    """Where a learner resumed from: what every rank of a group loads alike."""

    #: The newest policy version in use; the next publish goes past it.
    version: int
    #: The checkpoint loaded (its path under the shared root), if any.
    checkpoint: str | None = None
    #: The published policy whose weights were taken over the checkpoint's, if any.
    policy: PolicyRef | None = None


def load_checkpoint(store: SharedStore, learner: Learner, path: str, algo: str) -> int:
    """Load a checkpoint of the job's algorithm `algo` into `learner`; returns the
    policy version it was written at.

    Raises:
        Exception: it cannot be read, was written by another algorithm, or holds
            non-finite weights.
    """
    checkpoint = read_checkpoint(store, path, algo=algo, device=learner.device)
    if not finite(checkpoint.model):
        raise NonFiniteWeights("non-finite weights")
    learner.load_state_dict(checkpoint.model)
    return checkpoint.policy_version


def load_policy(store: SharedStore, learner: Learner, ref: PolicyRef, algo: str) -> None:
    """Take a published version's weights and train iteration.

    Raises:
        OSError, CorruptFileError, RuntimeError: it cannot be read or does not fit.
        WrongAlgorithm: another algorithm than the job's `algo` wrote it.
    """
    policy = store.read_policy(ref.path, sha256=ref.sha256, algo=algo)
    if not finite(policy.tensors):
        raise CorruptFileError(f"{ref.path}: non-finite weights")
    learner.load_policy(policy.tensors)
    learner.train_iter = policy.train_iter


def resume(
    store: SharedStore, job_id: str, algo: str, learner: Learner, ctx: TaskContext
) -> Resumed:
    """Continue where the job's last learner stopped.

    The newest readable checkpoint gives networks, optimizer and counters. When a
    newer policy was published after it, its weights and train iteration are taken
    too (the target network restarts from them), so little training is repeated:
    newer means further in training, by a lease no older than the checkpoint's. (A
    checkpoint of a newer lease that another job's learner wrote, population-based
    training's exploit, starts a new line: the job's own older versions are not it.)
    A file another algorithm than the job's `algo` wrote is passed over.
    """
    version = 0
    checkpoint: str | None = None
    checkpoint_epoch = 0
    folder = f"{job_id}/checkpoints"
    for name in reversed(store.checkpoints(job_id)):  # the newest lease's newest first
        try:
            version = load_checkpoint(store, learner, f"{folder}/{name}", algo)
            checkpoint = f"{folder}/{name}"
            checkpoint_epoch = (checkpoint_key(name) or (0, 0))[0]
            log.info("resumed from %s at train_iter %d", name, learner.train_iter)
            break
        except Exception as exc:  # a damaged checkpoint: try the one before it
            log.warning("checkpoint %s unusable: %s", name, exc)
    try:
        latest = patiently(ctx.stop, ctx.coordinator.latest_policy, job_id)
    except (ApiError, ServiceUnavailable) as exc:
        raise JobOver(f"cannot read the newest policy version: {exc}") from exc
    taken: PolicyRef | None = None
    if (
        latest is not None
        and latest.train_iter > learner.train_iter
        and latest.epoch >= checkpoint_epoch
    ):
        try:
            load_policy(store, learner, latest, algo)
            taken = latest
            log.info(
                "took version %d's weights (train_iter %d)", latest.version, learner.train_iter
            )
        except (OSError, CorruptFileError, WrongAlgorithm, RuntimeError) as exc:
            log.warning("newest policy %d unusable: %s", latest.version, exc)
    # A version written but never announced (the coordinator restarted, or a learner
    # whose lease was taken over) still owns its file name: the next publish goes past
    # it (and one written after this look is passed over at the write: write_policy).
    on_disk = [
        int(name.split(".")[0])
        for name in store.list_dir(f"{job_id}/policies")
        if name.endswith(".safetensors") and name.split(".")[0].isdigit()
    ]
    newest = max([version, latest.version if latest else 0, *on_disk])
    return Resumed(version=newest, checkpoint=checkpoint, policy=taken)
