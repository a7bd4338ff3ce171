"""`python -m tests.black_hole`: a collector that takes every task and runs none (a
broken env, a stuck task runner, a bad node): it registers and heartbeats as a
collector does, answers each assignment 202, and its heartbeats list no task. The
coordinator must lose those tasks, plan them on other collectors and hold this one
back (services/coordinator/workers.py); the fault benches and tests start it beside
real collectors. Settings as a collector's (`DROVER_*`)."""

from __future__ import annotations

import logging
import sys

from flask import Flask

from common.messages import TaskAssignment
from common.metrics import service_registry
from common.settings import SlaveSettings
from services.slave.app import create_slave_app
from services.slave.core import Slave, TaskContext, build_slave
from services.slave.main import run_slave

log = logging.getLogger(__name__)


class NoRunner:
    """Takes collect and evaluate tasks; never asked to run one."""

    kinds = frozenset({"collect", "evaluate"})

    def run(self, ctx: TaskContext) -> dict:
        raise AssertionError("a black hole runs nothing")


class BlackHole(Slave):
    """Answers every assignment as taken, and forgets it."""

    def assign(self, task: TaskAssignment) -> None:
        log.warning("took task %s (%s) and will never run it", task.task_id, task.kind)


def create_app(settings: SlaveSettings) -> Flask:
    slave = build_slave(
        "collector",
        NoRunner(),
        settings,
        resources={},
        metrics=service_registry(),
        slave_type=BlackHole,
    )
    return create_slave_app("drover.black-hole", slave, settings.token, settings.metrics_token)


if __name__ == "__main__":
    sys.exit(run_slave("collector", 8199, create_app))
