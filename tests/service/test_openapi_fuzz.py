"""The OpenAPI documents: complete, and honoured. schemathesis generates requests for
every coordinator and slave route from the document: no answer may be a 5xx, and
every answer must match what the document says."""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from common.storage import SharedStore
from services.coordinator.app import create_app
from services.coordinator.core import CoordinatorLimits
from services.coordinator.settings import CoordinatorSettings
from services.slave.app import create_slave_app
from services.slave.core import Slave
from tests.buffer_hosts import make_coordinator
from tests.fakes import BlockingRunner, FakeCoordinator
from tests.helpers import wait_until

# No 5xx, and every answer as the document says (status, content type, body). A job's
# `config` is an open object in the document and validated in depth by the
# coordinator, so "every schema-valid request is accepted" is not one of the checks.
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
TOKEN = "fuzz-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FUZZ = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
# The routes a probe of a live cluster once made answer 500 (numbers out of range,
# NaN, huge sizes): fuzzed harder, against a real job and a real worker.
FUZZ_MORE = settings(FUZZ, max_examples=150)
HARDER = {
    "POST /api/v1/workers",
    "POST /api/v1/workers/{worker_id}/heartbeat",
    "POST /api/v1/jobs/{job_id}/segments",
    "POST /api/v1/jobs/{job_id}/samples",
    "POST /api/v1/jobs/{job_id}/priorities",
    "POST /api/v1/jobs/{job_id}/policies",
    "POST /api/v1/tasks/{task_id}/complete",
    "GET /api/v1/jobs/{job_id}/policy",
    "GET /metrics",
}


@pytest.fixture(scope="module")
def coordinator_app(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    core = make_coordinator(SharedStore(root), CoordinatorLimits(max_buffer_items=10_000))
    app = create_app(CoordinatorSettings(shared_dir=root, token=TOKEN), core=core)
    client = app.test_client()
    buffer = {"replay_buffer_size": 100, "min_size_to_sample": 10}
    config = {"policy": {"other": {"replay_buffer": buffer}}}
    job = client.post("/api/v1/jobs", json={"config": config}, headers=AUTH).json
    worker = client.post(
        "/api/v1/workers",
        json={"role": "learner", "url": "http://127.0.0.1:1", "slave_token": "f" * 32},
        headers=AUTH,
    ).json
    app.config["FUZZ_IDS"] = {"job_id": job["job_id"], "worker_id": worker["worker_id"]}
    return app


@pytest.fixture(scope="module")
def slave_app(tmp_path_factory):
    slave = Slave(
        role="collector",
        runner=BlockingRunner(),
        coordinator=FakeCoordinator(),
        advertise_url="http://127.0.0.1:1",
        shared_root=tmp_path_factory.mktemp("s"),
    )
    slave.start()
    wait_until(lambda: slave.worker_id is not None, what="registration")
    yield create_slave_app("fuzz", slave, TOKEN)
    slave.close(timeout_s=5)


def test_every_route_is_documented(coordinator_app, slave_app):
    for app in (coordinator_app, slave_app):
        document = app.test_client().get("/openapi.json").json
        routes = {
            (rule.rule.replace("<", "{").replace(">", "}"), method.lower())
            for rule in app.url_map.iter_rules()
            for method in rule.methods - {"HEAD", "OPTIONS"}
            # The dashboard's page and files (public, no data) are not API.
            if rule.endpoint not in ("static", "openapi")
            and not rule.endpoint.startswith("dashboard.")
        }
        documented = {(path, m) for path, ops in document["paths"].items() for m in ops}
        assert routes == documented
    schemas = coordinator_app.test_client().get("/openapi.json").json["components"]["schemas"]
    assert schemas["SampleRequest"]["properties"]["batch_size"]["maximum"] == 8192


def fuzz(app, limit_waits=False):
    """Every operation of the app's document, with generated requests: no 5xx, and
    every answer as documented. Returns the operations exercised."""
    document = schemathesis.openapi.from_wsgi("/openapi.json", app)
    real_ids = app.config.get("FUZZ_IDS", {})
    exercised = []
    for result in document.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy(), real=st.booleans())
        @(FUZZ_MORE if operation.label in HARDER else FUZZ)
        def run(case, real):
            # Long-polls are bounded; here they need not wait at all.
            wait = case.body.get("timeout_s") if isinstance(case.body, dict) else None
            if limit_waits and isinstance(wait, int | float):
                case.body["timeout_s"] = min(wait, 0.05)
            if real:  # half the time at a real job and worker, past the 404s
                for name, value in real_ids.items():
                    if name in (case.path_parameters or {}):
                        case.path_parameters[name] = value
            case.call_and_validate(headers=AUTH, checks=CHECKS)

        run()
        exercised.append(operation.label)
    return exercised


def test_coordinator_routes_never_fail_and_match_the_document(coordinator_app):
    assert len(fuzz(coordinator_app, limit_waits=True)) >= 18


def test_slave_routes_never_fail_and_match_the_document(slave_app):
    assert len(fuzz(slave_app)) == 7
