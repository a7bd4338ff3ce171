"""Workflows: what a job does with the coordinator's workers.

A workflow shapes the job's replay, checks what only it cares about at submission,
plans assignments for free workers each scheduling pass, takes evaluation results and
lost tasks, and decides when the job has succeeded. The coordinator keeps jobs,
workers, tasks and leases, and asks the job's workflow what to do.

Adding one: a file here with a class implementing `Workflow`, and one line in
`WORKFLOWS`. It runs the algorithms whose collect unit is in its `collect_units`.
"""

from __future__ import annotations

from common.config import ConfigError, JobConfig
from jobconfig import algorithm_of
from services.coordinator.workflows.base import Demand, Planner, Workflow
from services.coordinator.workflows.evaluate import Evaluate
from services.coordinator.workflows.selfplay import SelfPlay
from services.coordinator.workflows.training import AsyncTraining, SyncTraining

WORKFLOWS: dict[str, Workflow] = {
    "async": AsyncTraining(),
    "sync": SyncTraining(),
    "evaluate": Evaluate(),
    "selfplay": SelfPlay(),
}


def workflow_of(config: JobConfig) -> Workflow:
    """The registry's entry for a job's `system.workflow` (checked at submission)."""
    return WORKFLOWS[config.system.workflow]


def check_workflow(config: JobConfig) -> Workflow:
    """The job's workflow, once it takes the config.

    Raises:
        ConfigError: an unknown workflow, one that cannot run the job's algorithm or
            env adapter (two-player games: selfplay alone), or a config it refuses.
    """
    name = config.system.workflow
    workflow = WORKFLOWS.get(name)
    if workflow is None:
        known = ", ".join(sorted(WORKFLOWS))
        raise ConfigError("system.workflow", f"unknown workflow '{name}' (known: {known})")
    unit = algorithm_of(config).collect_unit
    if unit not in workflow.collect_units:
        fitting = sorted(n for n, w in WORKFLOWS.items() if unit in w.collect_units)
        raise ConfigError("system.workflow", f"{config.policy.type} runs {' or '.join(fitting)}")
    # A two-player game is played by the self-play battle loop alone: any other
    # workflow's first collect or evaluate task would fail to make envs of it.
    if config.env.adapter == "pettingzoo" and name != "selfplay":
        raise ConfigError(
            "env.adapter",
            f"pettingzoo's two-player games are played by system.workflow: selfplay, not {name}",
        )
    workflow.check(config)
    return workflow


__all__ = ["WORKFLOWS", "Demand", "Planner", "Workflow", "check_workflow", "workflow_of"]
