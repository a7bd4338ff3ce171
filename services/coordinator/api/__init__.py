"""The coordinator's routes: one blueprint per resource."""

from flask import Blueprint

from common.http import extension
from services.coordinator.core import Coordinator

CORE = "drover.coordinator"


def core() -> Coordinator:
    return extension(CORE)


def blueprints() -> list[Blueprint]:
    from services.coordinator.api import health, jobs, policies, tasks, workers

    return [health.bp, jobs.bp, workers.bp, tasks.bp, policies.bp]
