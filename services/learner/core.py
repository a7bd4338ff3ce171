"""The learner's work: a `learn` task. No Flask.

The learner asks the coordinator for `num_batches` batches at once, prefetching the
next request (and starting its segment reads) while it trains on the current one;
reads the sampled rows from the segment files (caching them: segments are immutable);
trains; every `publish_every_iters` writes a new policy version and announces it, and
every `checkpoint_every_iters` writes a checkpoint, from which a restarted learner
resumes, both on a thread of their own while training goes on.

Segment files are written by other machines and trusted for nothing: each is checked
against the job's `SegmentSchema` before any row of it is trained on, and one that
does not fit costs its rows, never the task. Non-finite weights are never published
or checkpointed, and everything reported (progress, priorities) is finite.

In a learner group (services/learner/aggregator.py) this runs on every rank: rank 0's
sessions also send each reply's batches to the other ranks, and each rank's
`Trainer` trains on its own share of every global batch, reading it itself.

`LearnerRunner`, here, ties the parts together; each is a module of this package:

| module | keeps |
|---|---|
| `training.py` | the job's learner for a rank (`new_learner`), one rank's `Trainer` |
| `resume.py` | where a task starts: the newest checkpoint, a newer published policy |
| `sessions.py` | the task's loop: `BatchSession` (batches), `RoundSession` (rounds) |
| `segments.py` | `SegmentSchema` and its column checks, the `SegmentCache` |
| `reads.py` | segment reads on threads of their own, each waited for with a bound |
| `background.py` | publishes and checkpoints written off the training thread, in order |
| `sampling.py` | sample requests and what they carry (holds, priorities); `JobOver` |
| `feeder.py` | the feeder process: batches sampled and gathered beside the training thread |
| `guards.py` | finite weights, progress and priorities |
| `tensorboard.py` | the learner's TensorBoard scalars (`TrainBoard`) |
| `metrics.py` | what a learner counts for Prometheus (`LearnerMetrics`) |

A learner group's ranks talk through `group.py`; `aggregator.py` runs them.
"""

from __future__ import annotations

from typing import Any

import torch
from prometheus_client import CollectorRegistry

from common.config import JobConfig
from common.messages import LearnSpec, dump
from common.storage import SharedStore
from jobconfig import read_job_config
from jobconfig.ranks import split_error
from services.learner.feeder import discard_spare
from services.learner.group import GroupBroken, RankGroup
from services.learner.metrics import LearnerMetrics
from services.learner.resume import resume
from services.learner.sessions import BatchSession, RoundSession
from services.learner.training import new_learner
from services.slave.core import TaskContext


class LearnerRunner:
    """Runs `learn` tasks (the TaskRunner of a learner, and of a learner group's rank
    0, which passes `group`: services/learner/aggregator.py)."""

    kinds = frozenset({"learn"})

    def __init__(
        self,
        store: SharedStore,
        group: RankGroup | None = None,
        *,
        metrics: LearnerMetrics | None = None,
    ) -> None:
        self.store = store
        self.group = group
        #: Counted in the service's registry (a private one when None: tests).
        self.metrics = metrics or LearnerMetrics(CollectorRegistry())

    def run(self, ctx: TaskContext) -> dict[str, Any]:
        job_id = ctx.task.job_id
        config = read_job_config(self.store, job_id)
        torch.set_num_threads(config.policy.learn.threads(config.system.torch_num_threads))
        spec = ctx.task.spec
        return self.learn(ctx, config, spec)

    def learn(self, ctx: TaskContext, config: JobConfig, spec: LearnSpec) -> dict[str, Any]:
        """Train the job's algorithm from where its last learner stopped, in the mode
        the task says (the coordinator's workflow chose it), until the task stops."""
        group = self.group
        if group is not None:
            error = split_error(config.policy, group.world_size)
            if error is not None:  # before any rank builds anything
                raise ValueError(f"{error[0]}: {error[1]}")
        learner = new_learner(config, spec.seed, group)
        resumed = resume(self.store, ctx.task.job_id, config.policy.type, learner, ctx)
        if group is not None:
            group.send(
                {
                    "kind": "task",
                    "job_id": ctx.task.job_id,
                    "seed": spec.seed,
                    "checkpoint": resumed.checkpoint,
                    "policy": dump(resumed.policy) if resumed.policy else None,
                }
            )
            group.broadcast_state(learner.state_dict())
        args = (ctx, config, self.store, learner, resumed.version, group)
        # A learner group's rank 0 sends each batch as sampled to the other ranks.
        feed_process = (
            spec.mode == "batches" and config.policy.learn.feed == "process" and group is None
        )
        if not feed_process:
            discard_spare()
        try:
            if spec.mode == "rounds":
                result = RoundSession(*args, metrics=self.metrics).run()
            else:
                result = BatchSession(*args, metrics=self.metrics, feed_process=feed_process).run()
        except GroupBroken:
            raise
        except Exception:
            self._end_group()
            raise
        self._end_group()
        return result

    def _end_group(self) -> None:
        if self.group is not None:
            self.group.send({"kind": "end"})
