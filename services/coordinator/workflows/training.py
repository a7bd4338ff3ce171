"""Training workflows: collectors collect, one learner trains, an evaluation runs every
`eval_freq` train iterations (once env steps have passed the last evaluation's), and
the job succeeds at `stop_value`.

`async`: collectors run freely with the newest policy they have (DQN, SAC, IMPALA
with a bound on policy lag). `sync`: rounds of exactly `n_sample` items with one
policy version, split evenly over the collectors the job expects (PPO).
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from common.config import ConfigError, JobConfig, ReplayBufferConfig
from common.errors import bad_request
from common.messages import (
    MAX_BATCH_SIZE,
    CollectSpec,
    EvalResult,
    EvalSummary,
    EvaluateSpec,
    LearnSpec,
)
from common.video import video_path
from jobconfig import algorithm_of
from services.coordinator.workflows.base import Demand, Outcome, Planner

if TYPE_CHECKING:
    from services.coordinator.state import Dispatch, Job, Task, TaskState, Worker

log = logging.getLogger(__name__)


@dataclass
class TrainingState:
    #: Train iteration of the newest policy sent for evaluation.
    eval_requested_iter: int = 0
    #: Since when (the coordinator's clock) the job, its budget spent, waits for its
    #: final evaluation (`final_eval`); None: it does not. Not recorded: after a restart
    #: the wait starts again, still bounded.
    final_since_s: float | None = None
    #: Its evaluations that were lost (their worker gone, or never running them).
    evaluations_lost: int = 0


class AsyncTraining:
    collect_units = frozenset({"transitions", "unrolls"})
    roles = frozenset({"collector", "learner"})
    replays = True
    has_league = False

    def check(self, config: JobConfig) -> None:
        pass

    def replay(self, config: JobConfig) -> ReplayBufferConfig:
        replay = config.policy.other.replay_buffer
        lag = config.system.max_policy_lag
        if lag is not None:
            # The bound on policy lag is enforced where data is sampled.
            bound = lag if replay.max_staleness is None else min(lag, replay.max_staleness)
            replay = dataclasses.replace(replay, max_staleness=bound)
        return replay

    def admit(self, config: JobConfig, planner: Planner) -> None:
        size = config.policy.other.replay_buffer.replay_buffer_size
        if size > planner.limits.max_buffer_items:
            raise bad_request(
                "config.policy.other.replay_buffer.replay_buffer_size",
                f"{size} exceeds this coordinator's limit of {planner.limits.max_buffer_items}",
            )

    #: What the learner runs: batches sampled as they come.
    learn_mode: Literal["batches", "rounds"] = "batches"

    def collect_mode(self, job: Job) -> Literal["transitions", "unrolls", "rounds", "battle"]:
        """The collector's loop: the algorithm's unit of step data."""
        return algorithm_of(job.config).collect_unit

    def round_steps(self, job: Job, planner: Planner) -> int | None:
        """Env steps each collector contributes to a round (None: no rounds)."""
        return None

    def demand(self, job: Job) -> Demand:
        """Its collectors, or as many as its share gives; one learner."""
        return Demand(collectors=job.config.system.collector_num, learner=True)

    def plan(self, job: Job, planner: Planner) -> list[Dispatch]:
        kinds = planner.active_kinds(job)
        plan: list[Dispatch] = []
        if job.workflow_state.final_since_s is not None:
            # The budget is spent: only its final evaluation is left to run.
            return self._plan_evaluation(job, planner, kinds)
        if kinds.get("learn", 0) == 0 and planner.share(job, "learner") > 0:
            # One learner (which may be a group of ranks).
            learners = [w for w in planner.free_workers("learner", "learn") if not w.task_ids]
            if learners:
                spec = LearnSpec(seed=planner.seed(job), mode=self.learn_mode)
                plan.append(planner.assign(job, learners[0], spec))
        wanted = planner.share(job, "collector")
        collectors = planner.free_workers("collector", "collect")
        for worker in collectors[: max(0, wanted - kinds.get("collect", 0))]:
            spec = CollectSpec(
                seed=planner.seed(job),
                num_envs=job.config.env.collector_env_num,
                mode=self.collect_mode(job),
                round_steps=self.round_steps(job, planner),
            )
            plan.append(planner.assign(job, worker, spec))
        return plan + self._plan_evaluation(job, planner, kinds)

    def _plan_evaluation(self, job: Job, planner: Planner, kinds: dict[str, int]) -> list[Dispatch]:
        """An evaluation of the newest policy, when one is due and none runs."""
        evaluators = planner.free_workers("collector", "evaluate")
        job.eval_stall = self._eval_stall(job, planner, evaluators)
        if kinds.get("evaluate", 0) or not self._eval_due(job) or not evaluators:
            return []
        assert job.policy is not None
        # The least busy collector evaluates, so collection slows the least (of those,
        # one of the job's own: the planner offers them first).
        worker = min(evaluators, key=lambda w: len(w.task_ids))
        job.workflow_state.eval_requested_iter = job.policy.train_iter
        return [planner.assign(job, worker, self.evaluate_spec(job, planner))]

    @staticmethod
    def _eval_stall(job: Job, planner: Planner, evaluators: list[Worker]) -> str:
        """Why the job has had no evaluation for `eval_stall_periods` eval_freqs of
        train iterations ("" while they keep up): a job with a `stop_value` would
        never stop, and nothing else would say so."""
        eval_freq = job.config.policy.eval.evaluator.eval_freq
        since = train_iters_since_eval(job)
        if since is None or since < planner.limits.eval_stall_periods * eval_freq:
            return ""
        lost = job.workflow_state.evaluations_lost
        return (
            f"no evaluation for {since} train iterations (eval_freq {eval_freq}): "
            f"{lost} evaluations lost, {len(evaluators)} collectors free to evaluate"
        )

    def evaluate_spec(self, job: Job, planner: Planner) -> EvaluateSpec:
        """An evaluation of the job's newest policy version."""
        assert job.policy is not None
        video_every = job.config.policy.eval.video_every
        return EvaluateSpec(
            seed=planner.seed(job),
            num_envs=job.config.env.evaluator_env_num,
            episodes=job.config.env.n_evaluator_episode,
            policy_version=job.policy.version,
            policy_path=job.policy.path,
            policy_sha256=job.policy.sha256,
            video=video_every is not None and len(job.evals) % video_every == 0,
        )

    @staticmethod
    def _eval_due(job: Job) -> bool:
        if job.policy is None or job.policy.version == 0:
            return False
        if job.workflow_state.final_since_s is not None:
            return not _newest_evaluated(job)
        # An evaluation is recorded at the job's env steps when its result comes, and
        # one runs at a time: one planned only once env steps passed the last one's has
        # a point of its own on the env-steps axis (TensorBoard, the metrics). Without
        # this, a learner training on while no env step came in (the limiter's slack,
        # the only collector evaluating) had two evaluations at one step.
        if job.evals and job.env_steps <= job.evals[-1].env_steps:
            return False
        eval_freq = job.config.policy.eval.evaluator.eval_freq
        since = job.policy.train_iter - job.workflow_state.eval_requested_iter
        # Below the last one evaluated: its learner resumed another line of training
        # (population-based training's exploit), whose count starts where it is.
        return since >= eval_freq or since < 0

    def evaluated(self, job: Job, task: Task, result: EvalResult, planner: Planner) -> None:
        returns = result.returns
        train_iter = job.train_iters
        if job.policy is not None and job.policy.version == result.policy_version:
            train_iter = job.policy.train_iter
        summary = EvalSummary(
            return_mean=statistics.fmean(returns),
            return_std=statistics.pstdev(returns),
            episodes=len(returns),
            policy_version=result.policy_version,
            train_iter=train_iter,
            env_steps=job.env_steps,
            return_min=min(returns),
            return_max=max(returns),
            video=video_of(job, result),
            video_error=result.video_error,
        )
        job.evals.append(summary)
        if result.video_error:
            log.warning("job %s: no video of its evaluation: %s", job.job_id, result.video_error)
        log.info(
            "job %s eval of version %d: %.1f ± %.1f over %d episodes",
            job.job_id,
            summary.policy_version,
            summary.return_mean,
            summary.return_std,
            summary.episodes,
        )
        if job.best_eval is None or summary.return_mean > job.best_eval.return_mean:
            job.best_eval = summary
            best = {
                "version": summary.policy_version,
                "path": planner.store.policy_path(job.job_id, summary.policy_version),
                "return_mean": summary.return_mean,
            }
            path = f"{job.job_id}/policies/best.json"
            planner.defer(lambda: planner.store.write_json(path, best), latest_of=path)

    def task_ended(self, job: Job, task: Task, state: TaskState) -> None:
        if task.kind == "evaluate":
            if state == "lost":
                job.workflow_state.evaluations_lost += 1
            # Whatever ended it (a refused dispatch, a failure, a lost lease), the
            # evaluation is due again at the next pass, not a whole eval_freq later.
            job.workflow_state.eval_requested_iter = job.evals[-1].train_iter if job.evals else 0

    def outcome(self, job: Job) -> Outcome | None:
        """Succeeded once an evaluation's mean return reaches `stop_value`."""
        stop_value = job.config.env.stop_value
        last = job.evals[-1] if job.evals else None
        if stop_value is None or last is None or last.return_mean < stop_value:
            return None
        return Outcome(
            "succeeded",
            f"eval return {last.return_mean:.1f} >= stop_value {stop_value} "
            f"(policy version {last.policy_version})",
        )

    def kept_versions(self, job: Job) -> set[int]:
        return set()

    def scalars(self, job: Job) -> dict[str, float]:
        return {}

    def final_evaluation(self, job: Job, now_s: float, timeout_s: float) -> bool:
        policy, state = job.policy, job.workflow_state
        if not job.config.policy.eval.evaluator.final_eval or policy is None:
            return False
        if policy.version == 0 or _newest_evaluated(job):
            return False  # nothing to evaluate, or its newest policy is evaluated
        if state.final_since_s is None:
            state.final_since_s = now_s
            log.info(
                "job %s: its budget is spent; evaluating policy version %d before it ends",
                job.job_id,
                policy.version,
            )
        if now_s - state.final_since_s < timeout_s:
            return True
        log.warning(
            "job %s: no final evaluation within %g s; it ends without one",
            job.job_id,
            timeout_s,
        )
        return False

    def new_state(self, config: JobConfig) -> TrainingState:
        return TrainingState()

    def record(self, state: TrainingState) -> dict[str, Any]:
        return {"eval_requested_iter": state.eval_requested_iter}

    def restore(self, record: dict[str, Any], config: JobConfig) -> TrainingState:
        return TrainingState(eval_requested_iter=int(record.get("eval_requested_iter", 0)))


def video_of(job: Job, result: EvalResult) -> str | None:
    """The evaluation's video, where its collector must have written it: a path a
    result names anywhere else is not taken (nor its GIF)."""
    expected = video_path(job.job_id, result.policy_version)
    if result.video is None:
        return None
    if result.video != f"{expected}.mp4" or result.video_gif != f"{expected}.gif":
        log.warning("job %s: an evaluation named a video elsewhere (%s)", job.job_id, result.video)
        return None
    return result.video


class SyncTraining(AsyncTraining):
    collect_units = frozenset({"rounds"})

    def check(self, config: JobConfig) -> None:
        buffer = config.policy.other.replay_buffer
        if buffer.type != "fifo" or buffer.max_staleness != 0:
            raise ConfigError(
                "policy.other.replay_buffer",
                "the sync workflow needs type: fifo and max_staleness: 0 "
                "(each round trains on exactly its own data)",
            )
        n_sample = config.policy.collect.n_sample
        if n_sample > min(buffer.replay_buffer_size, MAX_BATCH_SIZE):
            raise ConfigError(
                "policy.collect.n_sample",
                f"{n_sample} must fit in one sample request ({MAX_BATCH_SIZE}) and "
                f"in replay_buffer_size {buffer.replay_buffer_size}",
            )

    learn_mode: Literal["batches", "rounds"] = "rounds"

    def collect_mode(self, job: Job) -> Literal["transitions", "unrolls", "rounds", "battle"]:
        return "rounds"

    def demand(self, job: Job) -> Demand:
        """A round's collectors, all at once; one learner."""
        return Demand(collectors=job.config.system.collector_num, gang=True, learner=True)

    def round_steps(self, job: Job, planner: Planner) -> int | None:
        """n_sample split evenly over the round's collectors (rounded up): the set the
        job is given whole."""
        expected = max(1, planner.share(job, "collector"))
        return -(-job.config.policy.collect.n_sample // expected)


def _newest_evaluated(job: Job) -> bool:
    """Whether the job's last evaluation is of its newest policy version."""
    return (
        bool(job.evals)
        and job.policy is not None
        and (job.evals[-1].policy_version >= job.policy.version)
    )


def train_iters_since_eval(job: Job) -> int | None:
    """Train iterations since those of the last evaluated policy (since the start
    before the first); None for a job with no learner or no policy yet."""
    if job.policy is None or job.policy.version == 0:
        return None
    return max(0, job.train_iters - (job.evals[-1].train_iter if job.evals else 0))
