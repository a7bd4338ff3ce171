"""The evaluate workflow: run a given policy file, a learner checkpoint or random
actions for `episodes` episodes, shared among the free collectors; write the results
(JSON and CSV) and succeed. Nothing is trained or replayed."""

from __future__ import annotations

import dataclasses
import statistics
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from algorithms.base import CollectUnit
from common.config import ConfigError, JobConfig, ReplayBufferConfig
from common.errors import bad_request
from common.messages import EvalResult, EvalSummary, EvaluateSpec, dump
from common.storage import PathError
from services.coordinator.workflows.base import Demand, Outcome, Planner

if TYPE_CHECKING:
    from services.coordinator.state import Dispatch, Job, Task, TaskState


@dataclass
class EvaluationState:
    #: Per-episode results so far, and episodes handed out and not yet reported.
    episodes: list[dict[str, Any]] = field(default_factory=list)
    assigned: int = 0


class Evaluate:
    #: Any algorithm's policy can be evaluated.
    collect_units = frozenset(typing.get_args(CollectUnit))
    #: Collectors evaluate; nothing is trained, nothing replayed.
    roles = frozenset({"collector"})
    has_league = False
    replays = False

    def check(self, config: JobConfig) -> None:
        evaluate = config.system.evaluate
        if evaluate.source != "random" and not evaluate.path:
            raise ConfigError("system.evaluate.path", f"a {evaluate.source} source needs a path")

    def replay(self, config: JobConfig) -> ReplayBufferConfig:
        # Nothing is replayed: a token index instead of the configured one.
        return dataclasses.replace(
            config.policy.other.replay_buffer, replay_buffer_size=1, min_size_to_sample=1
        )

    def admit(self, config: JobConfig, planner: Planner) -> None:
        evaluate = config.system.evaluate
        if evaluate.source == "random":
            return
        field = "config.system.evaluate.path"
        try:
            if not planner.store.resolve(str(evaluate.path)).is_file():
                raise bad_request(field, f"no file at '{evaluate.path}' under the shared root")
        except PathError as exc:
            raise bad_request(field, str(exc)) from None

    def demand(self, job: Job) -> Demand:
        """No collect task and no learner: its evaluate tasks run beside other jobs'
        collect tasks, on any collector free to evaluate."""
        return Demand(collectors=0)

    @staticmethod
    def episodes(job: Job) -> int:
        return job.config.system.evaluate.episodes or job.config.env.n_evaluator_episode

    def plan(self, job: Job, planner: Planner) -> list[Dispatch]:
        """Share the episodes still to run among the free collectors."""
        free = planner.free_workers("collector", "evaluate")
        state: EvaluationState = job.workflow_state
        left = self.episodes(job) - len(state.episodes) - state.assigned
        plan = []
        evaluate = job.config.system.evaluate
        for i, worker in enumerate(free):
            if left <= 0:
                break
            share = -(-left // (len(free) - i))  # ceil: what is left, over who is left
            spec = EvaluateSpec(
                seed=planner.seed(job),
                num_envs=min(job.config.env.evaluator_env_num, share),
                episodes=share,
                source=evaluate.source,
                policy_path=evaluate.path,
            )
            state.assigned += share
            left -= share
            plan.append(planner.assign(job, worker, spec))
        return plan

    def evaluated(self, job: Job, task: Task, result: EvalResult, planner: Planner) -> None:
        assert isinstance(task.spec, EvaluateSpec)
        state: EvaluationState = job.workflow_state
        state.assigned -= task.spec.episodes
        for ret, length in zip(result.returns, result.lengths, strict=False):
            state.episodes.append(
                {
                    "return": ret,
                    "length": length,
                    "task_id": task.task_id,
                    "seed": task.spec.seed,
                }
            )
        wanted = self.episodes(job)
        if len(state.episodes) < wanted or not job.running:
            return
        episodes = state.episodes[:wanted]
        returns = [e["return"] for e in episodes]
        summary = EvalSummary(
            return_mean=statistics.fmean(returns),
            return_std=statistics.pstdev(returns),
            episodes=len(episodes),
            policy_version=0,
            train_iter=0,
            env_steps=sum(e["length"] for e in episodes),
            return_min=min(returns),
            return_max=max(returns),
        )
        job.evals.append(summary)
        job.env_steps = summary.env_steps
        source = job.config.system.evaluate
        results = {
            "source": source.source,
            "path": source.path,
            "summary": dump(summary),
            "episodes": episodes,
        }
        rows = ["episode,return,length,task_id,seed"] + [
            f"{i},{e['return']},{e['length']},{e['task_id']},{e['seed']}"
            for i, e in enumerate(episodes)
        ]
        csv = ("\n".join(rows) + "\n").encode()
        for path, write in (
            (f"{job.job_id}/eval/results.json", lambda p: planner.store.write_json(p, results)),
            (f"{job.job_id}/eval/results.csv", lambda p: planner.store.write_bytes(p, csv)),
        ):
            planner.defer(lambda path=path, write=write: write(path), latest_of=path)

    def task_ended(self, job: Job, task: Task, state: TaskState) -> None:
        if isinstance(task.spec, EvaluateSpec):
            job.workflow_state.assigned -= task.spec.episodes  # they go out again

    def outcome(self, job: Job) -> Outcome | None:
        """Succeeded once every episode is in (its summary is the job's evaluation)."""
        if not job.evals:
            return None
        summary = job.evals[-1]
        return Outcome(
            "succeeded",
            f"evaluated {summary.episodes} episodes of {job.config.system.evaluate.source}: "
            f"return {summary.return_mean:.1f} ± {summary.return_std:.1f}",
        )

    def final_evaluation(self, job: Job, now_s: float, timeout_s: float) -> bool:
        return False  # the job is its evaluation

    def new_state(self, config: JobConfig) -> EvaluationState:
        return EvaluationState()

    def record(self, state: EvaluationState) -> dict[str, Any]:
        # Episodes handed out and not reported go out again after a restart.
        return {"evaluation": list(state.episodes)}

    def restore(self, record: dict[str, Any], config: JobConfig) -> EvaluationState:
        return EvaluationState(episodes=list(record.get("evaluation", [])))

    def kept_versions(self, job: Job) -> set[int]:
        return set()

    def scalars(self, job: Job) -> dict[str, float]:
        return {}
