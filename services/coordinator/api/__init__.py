"""The coordinator's routes: one blueprint per resource."""

from flask import Blueprint, request

from common.errors import bad_request
from common.http import extension
from common.messages import MAX_INT32, MAX_WAIT_S
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


#: How a wait in the query string (`timeout_s`, `wait_s`) is written, for the OpenAPI
#: document: seconds, up to two digits and three decimals.
SECONDS_QUERY = {"type": "string", "pattern": "^[0-9]{1,2}(\\.[0-9]{1,3})?$"}


def seconds_query(name: str) -> float:
    """Seconds to wait from the query string (0 when absent; 400 when not from 0 to
    MAX_WAIT_S)."""
    raw = request.args.get(name)
    if raw is None:
        return 0.0
    try:
        value = float(raw) if len(raw) <= 16 else -1.0
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= MAX_WAIT_S:
        raise bad_request(name, f"'{raw[:32]}' is not a number of seconds from 0 to {MAX_WAIT_S}")
    return value


def blueprints() -> list[Blueprint]:
    from services.coordinator.api import (
        dashboard,
        data,
        experiments,
        health,
        jobs,
        league,
        policies,
        tasks,
        workers,
    )

    return [
        health.bp,
        jobs.bp,
        data.bp,
        experiments.bp,
        workers.bp,
        tasks.bp,
        policies.bp,
        league.bp,
        dashboard.bp,
    ]
