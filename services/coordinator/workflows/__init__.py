"""Workflows: what a job does with the coordinator's workers.

A workflow shapes the job's replay, checks what only it cares about at submission,
plans assignments for free workers each scheduling pass, takes evaluation results and
lost tasks, and decides when the job has succeeded. The coordinator keeps jobs,
workers, tasks and leases, and asks the job's workflow what to do.

Adding one: a file here with a class implementing `Workflow`, one line in
`WORKFLOWS`, and its name in `SystemConfig.workflow` (common/config.py).
"""

from __future__ import annotations

from services.coordinator.workflows.base import Planner, Workflow
from services.coordinator.workflows.evaluate import Evaluate
from services.coordinator.workflows.training import AsyncTraining, SyncTraining

WORKFLOWS: dict[str, Workflow] = {
    "async": AsyncTraining(),
    "sync": SyncTraining(),
    "evaluate": Evaluate(),
}

__all__ = ["WORKFLOWS", "Planner", "Workflow"]
