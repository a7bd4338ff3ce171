"""The coordinator's routes: one blueprint per resource."""

from flask import Blueprint, request

from common.errors import bad_request
from common.http import extension
from common.messages import MAX_INT32
from services.coordinator.core import Coordinator

CORE = "drover.coordinator"


def core() -> Coordinator:
    return extension(CORE)


def version_query(name: str) -> int | None:
    """A policy version from the query string (None when absent; 400 when not one)."""
    raw = request.args.get(name)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 10 and int(raw) <= MAX_INT32):
        raise bad_request(name, f"'{raw[:32]}' is not an integer from 0 to {MAX_INT32}")
    return int(raw)


def blueprints() -> list[Blueprint]:
    from services.coordinator.api import dashboard, health, jobs, league, policies, tasks, workers

    return [health.bp, jobs.bp, workers.bp, tasks.bp, policies.bp, league.bp, dashboard.bp]
