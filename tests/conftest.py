"""Fixtures every test directory shares, and the markers' bookkeeping.

Plain helpers (the polling `wait_until`, cluster and process helpers) are in
tests/helpers.py; the coordinator app's request helpers in tests/coordinator_app.py;
test doubles in tests/fakes.py. A test module imports from those, never from another
test module (tests/unit/test_test_layout.py).

Markers (declared in pyproject.toml), by what a test costs:
    processes  starts real service processes (a local cluster, `drover run`, ...)
    learning   trains a job to a return threshold (minutes)
    chaos      kills or stops service processes while a job runs
    browser    drives chromium through playwright
    torchrun   runs torch.distributed process groups
    smoke      a short job per workflow through real processes (make test-fast)
    long       runs for many minutes (the soak): only `make test-full`
    engine     needs a real Docker engine: only `make test-engine`
"""

from __future__ import annotations

import pytest

from common.storage import SharedStore
from services.coordinator.app import create_app
from services.coordinator.core import CoordinatorLimits
from services.coordinator.settings import CoordinatorSettings
from tests.buffer_hosts import MADE, make_coordinator, stop_made
from tests.coordinator_app import TOKEN


@pytest.fixture(autouse=True)
def _buffer_hosts():
    """Every coordinator a test made (`tests.buffer_hosts.make_coordinator`): its
    buffer hosts stop at the test's end (a module's fixture, made before, stays)."""
    since = len(MADE)
    yield
    stop_made(since)


@pytest.fixture
def core(tmp_path):
    """A coordinator on `tmp_path` as its shared root, without its scheduler thread:
    a test plans (`core.plan()`) when it wants to. Its jobs' buffers are served in
    threads of this process (tests/buffer_hosts.py)."""
    return make_coordinator(SharedStore(tmp_path), CoordinatorLimits(max_buffer_items=1000))


@pytest.fixture
def client(tmp_path, core):
    """Flask's test client of `core`'s app, which takes the cluster token
    `tests.coordinator_app.TOKEN`."""
    app = create_app(CoordinatorSettings(shared_dir=tmp_path, token=TOKEN), core=core)
    return app.test_client()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # `slow` is the old name of `learning`: `-m slow` still selects those tests.
    for item in items:
        if item.get_closest_marker("learning") is not None:
            item.add_marker(pytest.mark.slow)
