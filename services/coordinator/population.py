"""Population-based training over an experiment's jobs (jobconfig/population.py holds
its section; Jaderberg et al., 2017).

Each time a member's evaluation is recorded (planning.py, after its workflow took
it), and the member has had `ready` evaluations since its last ranking, the running
members with an evaluation are ranked by their last one's mean return. A member in
the bottom `quantile` takes the checkpoint of one of the top `quantile` (drawn; one
better than it) in three steps:

1. Under the lock: it takes the donor's hyperparameters, perturbed (a value its
   config class refuses: the donor's as it is), its learn lease epoch is raised and
   its learn task cancelled, so the learner it had can neither publish nor leave a checkpoint that
   sorts past the copy (docs/architecture.md, "Fencing"); no learn task of it
   starts until step 3 (`Job.learn_hold`).
2. Off the lock: the donor's newest checkpoint is copied into the member's
   checkpoints under the raised epoch, and the perturbed config written to its
   `job.json`, which its next learner reads.
3. Under the lock: the member takes the new config, its hold is lifted, and the
   step joins the experiment's lineage (written to its record).

Its next learner resumes from the copy: the donor's weights, optimizer moments and
train iteration, at the member's new learning rates (algorithms/step.py,
`load_optimizer_state`). The member keeps its own replay buffer, env step count and
policy version numbers.
"""

from __future__ import annotations

import dataclasses
import logging
import random

from common.config import ConfigError, JobConfig, to_dict
from common.messages import PopulationStep
from common.storage import checkpoint_key
from jobconfig.population import Population, perturbed
from jobconfig.resolve import resolve_job_config
from jobconfig.sections import value_at
from jobconfig.sweep import Point, member_config
from services.coordinator.experiments import append_lineage, write_experiment
from services.coordinator.jobs import config_record
from services.coordinator.state import CoordinatorState, Experiment, Job
from services.coordinator.tasks import TaskBoard

log = logging.getLogger(__name__)


class PopulationTraining:
    def __init__(self, state: CoordinatorState, tasks: TaskBoard) -> None:
        self.state = state
        self.tasks = tasks

    def evaluated(self, job: Job) -> None:
        """After the job's evaluation was recorded (under the coordinator's lock)."""
        experiment = self.state.experiments.get(job.experiment_id or "")
        if experiment is None or experiment.population is None or experiment.stopped:
            return
        if not job.running or job.learn_hold or not job.evals:
            return
        last_step = next((s for s in reversed(experiment.lineage) if s.job_id == job.job_id), None)
        if last_step is not None and job.evals[-1].policy_version <= last_step.policy_version:
            return  # an evaluation of the line it left, which came after its step
        spec = experiment.population
        if len(job.evals) - experiment.ranked_at_evals.get(job.job_id, 0) < spec.ready:
            return
        experiment.ranked_at_evals[job.job_id] = len(job.evals)
        draw = rng(spec, job)  # one stream for the step: its donor, then its factors
        donor = self.donor(experiment, job, spec, draw)
        if donor is not None:
            self.exploit(experiment, job, donor, spec, draw)

    def donor(
        self, experiment: Experiment, job: Job, spec: Population, draw: random.Random
    ) -> Job | None:
        """A top member for `job` to copy, when `job` is in the bottom quantile."""
        members = [
            member
            for entry in experiment.jobs
            if (member := self.state.jobs.get(entry.job_id)) is not None
            and member.running
            and member.evals
        ]
        if len(members) < 2:
            return None
        members.sort(key=lambda m: m.evals[-1].return_mean)
        cut = max(1, int(spec.quantile * len(members)))
        if job not in members[:cut]:
            return None
        mine = job.evals[-1].return_mean
        better = [m for m in members[-cut:] if m.evals[-1].return_mean > mine]
        return draw.choice(better) if better else None

    def exploit(
        self, experiment: Experiment, job: Job, donor: Job, spec: Population, draw: random.Random
    ) -> None:
        """Step 1 (module doc): decide, fence off the member's learner, copy later (the
        explored config is resolved then, off the lock)."""
        mine, theirs = config_record(job), config_record(donor)
        before = {key: value_at(mine, key) for key in spec.params}
        taken = {key: value_at(theirs, key) for key in spec.params}
        perturbed_values = {
            key: perturbed(value, draw.choice(spec.perturb)) for key, value in taken.items()
        }
        choices = [perturbed_values, taken, before]
        job.learner_epoch += 1
        epoch = job.learner_epoch
        job.learn_hold = f"taking {donor.job_id}'s checkpoint (population-based training)"
        self.tasks.cancel_job_tasks(job, "learn")
        step = PopulationStep(
            at=self.state.wall(),
            job_id=job.job_id,
            env_steps=job.env_steps,
            eval_return=job.evals[-1].return_mean,
            donor_id=donor.job_id,
            donor_env_steps=donor.env_steps,
            donor_return=donor.evals[-1].return_mean,
            checkpoint=None,
            before=before,
            after=perturbed_values,
            policy_version=job.policy.version if job.policy is not None else 0,
        )
        log.info(
            "population %s: job %s (%.1f) takes job %s's checkpoint (%.1f)",
            experiment.experiment_id,
            job.job_id,
            step.eval_return,
            donor.job_id,
            step.donor_return,
        )
        config = job.config
        self.state.guard.defer(
            lambda: self._copy(experiment, job, step, epoch, explored(config, choices))
        )

    def _copy(
        self,
        experiment: Experiment,
        job: Job,
        step: PopulationStep,
        epoch: int,
        explored_config: tuple[JobConfig, dict[str, float]],
    ) -> None:
        """Steps 2 and 3 (module doc), off the lock: `explored_config` (its config
        and the values it took) resolved there too."""
        config, after = explored_config
        step = dataclasses.replace(step, after=after)
        log.info(
            "population %s: job %s explores %s",
            experiment.experiment_id,
            job.job_id,
            ", ".join(
                f"{k.rsplit('.', 1)[-1]} {step.before[k]:.4g} -> {v:.4g}" for k, v in after.items()
            ),
        )
        store = self.state.store
        checkpoint = None
        wrote_config = False
        try:
            names = store.checkpoints(step.donor_id)
            if names:
                _, train_iter = checkpoint_key(names[-1]) or (0, 0)
                store.copy(
                    f"{step.donor_id}/checkpoints/{names[-1]}",
                    store.checkpoint_path(job.job_id, train_iter, epoch),
                    once=True,
                )
                checkpoint = names[-1]
            store.write_json(f"{job.job_id}/job.json", to_dict(config))
            wrote_config = True
        except Exception:  # a full volume, a damaged donor file: it resumes what it has
            log.exception("population step of job %s half done", job.job_id)
        finally:
            # Whatever happened, the member gets a learner again.
            with self.state.guard.changing():
                if wrote_config:
                    job.config = config
                job.learn_hold = ""
                after = step.after if wrote_config else step.before
                append_lineage(
                    self.state,
                    experiment,
                    dataclasses.replace(step, checkpoint=checkpoint, after=after),
                )
                self.state.guard.notify()  # its learn task may start now
        write_experiment(self.state, experiment)  # its members' ranks


def rng(spec: Population, job: Job) -> random.Random:
    """The draws of one member's step: the same for a member at the same evaluation."""
    return random.Random(f"{spec.seed}/{job.job_id}/{len(job.evals)}")


def explored(
    config: JobConfig, choices: list[dict[str, float]]
) -> tuple[JobConfig, dict[str, float]]:
    """The config with each key's first value in `choices` its config class takes
    (the donor's perturbed, else the donor's, else the member's own: a fraction past
    1 or a batch past the buffer is refused), and those values."""
    kept = dict(choices[-1])
    explored_config = config
    for key in kept:
        for values in choices:
            candidate = {**kept, key: values[key]}
            try:
                explored_config, _ = resolve_job_config(
                    member_config(to_dict(config), Point(candidate, config.system.seed))
                )
            except ConfigError as exc:
                log.info("population step: %s is not %s (%s)", key, values[key], exc)
                continue
            kept = candidate
            break
    return explored_config, kept
