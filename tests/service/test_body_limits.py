"""Request bodies are held to what their message can legitimately hold: every route that
takes a body refuses one over its limit from its Content-Length, before reading it (and
one sent without a Content-Length once it passes the limit); a body with more arrays,
objects, values or nesting than its message holds is refused before it is parsed; the
largest legitimate body of each message passes."""

import io
import json
import random
from pathlib import Path

import numpy as np
import pytest

from common.config import MAX_CONFIG_DEPTH, MAX_CONFIG_ITEMS
from common.config import check_shape as check_config_shape
from common.errors import ApiError
from common.http import MAX_BODY_BYTES, check_shape, nesting, structure
from common.http_server import ServerLimits
from common.messages import (
    MAX_EPISODES_PER_SEGMENT,
    MAX_EVAL_EPISODES,
    MAX_INT32,
    MAX_KEYS_PER_UPDATE,
    MAX_MATCHES_PER_DRAW,
    MAX_RESULTS_PER_REPORT,
    MAX_SEGMENT_ROWS,
    MAX_SEGMENTS_PER_INSERT,
    MAX_TASKS_PER_HEARTBEAT,
    EvalResult,
    ExperimentSubmit,
    GameResults,
    Heartbeat,
    JobSubmit,
    MatchDraw,
    PolicyAnnounce,
    PriorityUpdate,
    SampleRequest,
    SegmentInsert,
    TaskAssignment,
    TaskComplete,
    TaskFail,
    WorkerRegistration,
    parse,
)
from common.storage import SharedStore
from jobconfig import load_config_file
from services.collector.step_data import EpisodeTracker
from services.coordinator.app import create_app
from services.coordinator.settings import CoordinatorSettings
from services.slave.app import create_slave_app
from services.slave.core import Slave
from tests.buffer_hosts import make_coordinator
from tests.coordinator_app import submit
from tests.fakes import BlockingRunner, FakeCoordinator
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def coordinator_client(tmp_path):
    settings = CoordinatorSettings(shared_dir=tmp_path, token=TOKEN)
    return create_app(settings, core=make_coordinator(SharedStore(tmp_path))).test_client()


@pytest.fixture
def slave_client(tmp_path):
    slave = Slave(
        role="collector",
        runner=BlockingRunner(),
        coordinator=FakeCoordinator(),
        advertise_url="http://127.0.0.1:1",
        shared_root=tmp_path / "slave",
    )
    slave.start()
    wait_until(lambda: slave.worker_id is not None, what="registration")
    yield create_slave_app("test", slave, TOKEN).test_client()
    slave.close(timeout_s=5)


def body_routes(client):
    """(path, body message) of every route of the app that takes a body; a job's are
    a running job's (the coordinator passes its data routes on to its buffer)."""
    job_id = submit(client) if "drover.coordinator" in client.application.extensions else "x1"
    routes = []
    for rule in client.application.url_map.iter_rules():
        doc = getattr(client.application.view_functions[rule.endpoint], "__openapi__", None)
        if doc is not None and doc["body"] is not None:
            path = rule.rule
            for arg in rule.arguments:
                path = path.replace(f"<{arg}>", job_id if arg == "job_id" else "x1")
            routes.append((path, doc["body"]))
    return routes


class Unreadable(io.RawIOBase):
    """A request body of `size` bytes that fails the test if anything reads it."""

    def __init__(self, size):
        self.size, self.position = size, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=io.SEEK_SET):
        self.position = self.size + offset if whence == io.SEEK_END else offset
        return self.position

    def tell(self):
        return self.position

    def readinto(self, buffer):
        raise AssertionError("the body was read")


def test_every_body_route_refuses_a_body_over_its_limit_before_reading_it(
    coordinator_client, slave_client
):
    seen = set()
    for client in (coordinator_client, slave_client):
        for path, message in body_routes(client):
            limit = message.body_limit.max_bytes
            resp = client.post(
                path,
                input_stream=Unreadable(limit + 1),
                content_type="application/json",
                headers=AUTH,
            )
            assert resp.status_code == 413, (path, resp.json)
            assert resp.json["error"] == "request_entity_too_large"
            assert str(limit) in resp.json["message"], resp.json
            seen.add(message)
    assert seen == {
        WorkerRegistration,
        Heartbeat,
        TaskComplete,
        TaskFail,
        SegmentInsert,
        SampleRequest,
        PriorityUpdate,
        PolicyAnnounce,
        JobSubmit,
        ExperimentSubmit,
        TaskAssignment,
        MatchDraw,
        GameResults,
    }


def test_a_body_sent_without_a_content_length_is_held_to_the_same_limit(
    coordinator_client, slave_client
):
    for client in (coordinator_client, slave_client):
        for path, message in body_routes(client):
            limit = message.body_limit.max_bytes
            resp = client.post(
                path,
                input_stream=io.BytesIO(b" " * (limit + 1)),
                content_type="application/json",
                headers={**AUTH, "Transfer-Encoding": "chunked"},
                # What a server that reads chunked bodies itself says.
                environ_overrides={"wsgi.input_terminated": True},
            )
            assert resp.status_code == 413, (path, resp.json)
            assert str(limit) in resp.json["message"], resp.json
            at_limit = client.post(
                path,
                input_stream=io.BytesIO(b" " * limit),
                content_type="application/json",
                headers={**AUTH, "Transfer-Encoding": "chunked"},
                environ_overrides={"wsgi.input_terminated": True},
            )
            assert at_limit.status_code == 400, (path, at_limit.json)  # read, and not JSON


def test_every_limit_is_within_what_any_request_may_send_and_is_documented(coordinator_client):
    document = coordinator_client.get("/openapi.json").json
    submit = document["paths"]["/api/v1/jobs"]["post"]["requestBody"]
    assert str(JobSubmit.body_limit.max_bytes) in submit["description"]
    for _, message in body_routes(coordinator_client):
        assert message.body_limit.max_bytes <= MAX_BODY_BYTES == ServerLimits().max_body_bytes


# --- the largest legitimate bodies ------------------------------------------------------


def text(length, char="a"):
    return char * length


def full_precision(rng, count):
    """Floats whose JSON is as long as a float's gets (`-1.2345678901234567e-05`)."""
    return [-rng.random() * 1e-5 for _ in range(count)]


def largest_registration(rng):
    return WorkerRegistration, {
        "role": "collector",
        "url": "http://" + text(505),
        "slave_token": text(256),
        "resources": {f"{i:02d}" + text(62): text(256) for i in range(32)},
    }


def largest_heartbeat(rng):
    task = {
        "task_id": text(128),
        "state": "running",
        "progress": {f"{i:02d}" + text(62): v for i, v in enumerate(full_precision(rng, 64))},
        "unusable_segments": [text(1024) for _ in range(100)],
    }
    return Heartbeat, {"tasks": [task] * MAX_TASKS_PER_HEARTBEAT}


def largest_assignment(rng):
    spec = {
        "kind": "evaluate",
        "seed": 2**53,
        "num_envs": 2**53,
        "episodes": 2**53,
        "source": "checkpoint",
        "policy_version": MAX_INT32,
        "policy_path": text(1024),
        "policy_sha256": text(64, "f"),
        "opponents": ["heuristic", "heuristic"],
    }
    return TaskAssignment, {"task_id": text(128), "job_id": text(128), "spec": spec}


def largest_evaluation(rng):
    result = {
        "policy_version": MAX_INT32,
        "returns": full_precision(rng, MAX_EVAL_EPISODES),
        # Episodes of up to ten million steps.
        "lengths": [rng.randrange(10**6, 10**7) for _ in range(MAX_EVAL_EPISODES)],
    }
    return TaskComplete, {"result": result}


def largest_failure(rng):
    # Every character as long in JSON as one gets, or a bracket or comma.
    return TaskFail, {"error": text(4096, "\U0001f600")}


def bracketed_failure(rng):
    return TaskFail, {"error": text(4096 // 4, "[{,:")}


def segment_ref(rng, seq, episodes, *, path_chars=1024, big=False):
    path = f"job-1/segments/w.t/{seq:08d}.safetensors"
    return {
        "path": path + text(path_chars - len(path)),
        "rows": MAX_SEGMENT_ROWS,
        "env_steps": MAX_SEGMENT_ROWS,
        "policy_version": MAX_INT32,
        "episode_returns": full_precision(rng, episodes),
        "episode_lengths": [2**53 if big else rng.randrange(10**6, 10**7)] * episodes,
        "episodes": [[MAX_SEGMENT_ROWS, MAX_SEGMENT_ROWS]] * episodes,
    }


def largest_insert(rng):
    refs = [segment_ref(rng, seq, 100) for seq in range(MAX_SEGMENTS_PER_INSERT)]
    return SegmentInsert, {"segments": refs, "timeout_s": 60.0, "task_id": text(128)}


def fullest_reference(rng):
    ref = segment_ref(rng, 0, MAX_EPISODES_PER_SEGMENT, big=True)
    return SegmentInsert, {"segments": [ref], "timeout_s": 60.0, "task_id": text(128)}


def largest_sample_request(rng):
    return SampleRequest, {
        "batch_size": 8192,
        "num_batches": 8,
        "timeout_s": 60.0,
        "task_id": text(128),
        "acknowledge": [text(128) for _ in range(64)],
        "priority_keys": [2**63 - 1 - i for i in range(MAX_KEYS_PER_UPDATE)],
        "priorities": [-p for p in full_precision(rng, MAX_KEYS_PER_UPDATE)],
    }


def largest_priority_update(rng):
    return PriorityUpdate, {
        "keys": [2**63 - 1 - i for i in range(MAX_KEYS_PER_UPDATE)],
        "priorities": [-p for p in full_precision(rng, MAX_KEYS_PER_UPDATE)],
        "task_id": text(128),
    }


def largest_match_draw(rng):
    return MatchDraw, {"task_id": text(128), "count": MAX_MATCHES_PER_DRAW}


def largest_game_results(rng):
    results = [{"match_id": 2**53 - i, "outcome": "draw"} for i in range(MAX_RESULTS_PER_REPORT)]
    return GameResults, {"task_id": text(128), "results": results}


def largest_announce(rng):
    return PolicyAnnounce, {
        "version": MAX_INT32,
        "path": text(1024),
        "sha256": text(64, "f"),
        "train_iter": 2**53,
        "task_id": text(128),
    }


def nested(levels):
    """`levels` objects, each in the one before."""
    inner = {}
    for _ in range(levels - 1):
        inner = {"k": inner}
    return inner


def largest_config(rng):
    # MAX_CONFIG_ITEMS keys and items in all, some of them nested as deep as allowed.
    config = {"deep": nested(MAX_CONFIG_DEPTH)}
    config |= {f"key{i:05d}": [i, "x"] for i in range((MAX_CONFIG_ITEMS - MAX_CONFIG_DEPTH) // 3)}
    check_config_shape(config)
    return JobSubmit, {"config": config, "name": text(128)}


def example_configs(rng):
    configs = [load_config_file(p) for p in sorted((ROOT / "examples").glob("*.yaml"))]
    assert len(configs) >= 10
    # All of them in one job's config: bigger than any single real one.
    return JobSubmit, {"config": {f"c{i}": c for i, c in enumerate(configs)}}


@pytest.mark.parametrize(
    "largest",
    [
        largest_registration,
        largest_heartbeat,
        largest_assignment,
        largest_evaluation,
        largest_failure,
        bracketed_failure,
        largest_insert,
        fullest_reference,
        largest_sample_request,
        largest_priority_update,
        largest_announce,
        largest_match_draw,
        largest_game_results,
        largest_config,
        example_configs,
    ],
)
def test_the_largest_legitimate_body_of_each_message_passes(largest):
    message, value = largest(random.Random(0))
    # As the services' client writes it (requests' json=: ASCII, ", " and ": ").
    data = json.dumps(value).encode()
    limit = message.body_limit
    assert len(data) <= limit.max_bytes, f"{len(data)} > {limit.max_bytes}"
    check_shape(data, limit)
    parse(message, data)
    if message is TaskComplete:
        parse(EvalResult, value["result"])


def test_an_evaluation_result_within_its_body_limit_is_a_valid_one():
    # The limits are tight enough to matter: past them, the message refuses too.
    one_more = {
        "policy_version": 0,
        "returns": [0.0] * (MAX_EVAL_EPISODES + 1),
        "lengths": [1] * (MAX_EVAL_EPISODES + 1),
    }
    with pytest.raises(ValueError, match="at most 100000 items"):
        parse(EvalResult, one_more)


def test_a_collectors_reference_lists_at_most_its_bound_of_episodes():
    tracker = EpisodeTracker(num_envs=4)
    for _ in range(MAX_EPISODES_PER_SEGMENT):
        tracker.step(np.arange(4.0), np.ones(4, bool))  # four one-step episodes a step
    returns, lengths = tracker.take()
    assert len(returns) == len(lengths) == MAX_EPISODES_PER_SEGMENT
    assert returns[-4:] == [0.0, 1.0, 2.0, 3.0]  # the last ones
    assert tracker.take() == ([], [])


# --- bodies that cost more than their bytes -----------------------------------------------


def registration(resources_json: bytes) -> bytes:
    return (
        b'{"role": "collector", "url": "http://127.0.0.1:1", "slave_token": "'
        + b"s" * 32
        + b'", "resources": '
        + resources_json
        + b"}"
    )


@pytest.mark.parametrize(
    ("path", "data", "what"),
    [
        # Issue 23: millions of `{}` in a registration took a coordinator to a GiB.
        (
            "/api/v1/workers",
            registration(b'{"a": [' + b", ".join([b"{}"] * 4000) + b"]}"),
            "arrays and objects",
        ),
        (
            "/api/v1/workers",
            registration(b"{" + b", ".join(b'"%d": 1' % i for i in range(1000)) + b"}"),
            "values",
        ),
        # Each bad value would be one validation error, each about a KiB.
        (
            "/api/v1/jobs/x1/segments",
            b'{"segments": [{"path": "p", "rows": 1, "env_steps": 1, "policy_version": 0, '
            b'"episode_lengths": [' + b", ".join([b'""'] * 200_000) + b"]}]}",
            "values",
        ),
        (
            "/api/v1/jobs/x1/priorities",
            b'{"keys": [' + b",".join([b"[]"] * 10_000) + b'], "priorities": []}',
            "arrays and objects",
        ),
        # Each unknown key would be one too.
        (
            "/api/v1/jobs/x1/segments",
            b'{"segments": [{"path": "p", "rows": 1, "env_steps": 1, "policy_version": 0, '
            + b", ".join(b'"k%d": 0' % i for i in range(100_000))
            + b"}]}",
            "keys",
        ),
    ],
)
def test_bodies_with_more_structure_than_their_message_are_refused(
    coordinator_client, path, data, what
):
    if "/jobs/x1/" in path:  # a data route: passed on to the job's buffer, which checks it
        path = path.replace("x1", submit(coordinator_client))
    resp = coordinator_client.post(path, data=data, content_type="application/json", headers=AUTH)
    assert resp.status_code == 413, resp.json
    assert what in resp.json["message"], resp.json


def test_a_nested_json_bomb_is_refused_before_it_is_parsed(coordinator_client):
    # 150 levels: below the JSON parser's own limit (it would build them all), and
    # few enough arrays to pass their count: the depth scan refuses it.
    bomb = b'{"config": {"a": ' + b"[" * 150 + b"]" * 150 + b"}}"
    resp = coordinator_client.post(
        "/api/v1/jobs", data=bomb, content_type="application/json", headers=AUTH
    )
    assert resp.status_code == 400, resp.json
    # The scan's answer; the config's own check (after parsing) says "nested deeper".
    assert resp.json["message"] == (
        "body: a JobSubmit body nests arrays and objects at most 14 deep"
    )
    # Many more levels are refused by their count, before any depth is looked at.
    bomb = b'{"config": {"a": ' + b"[" * 400_000 + b"]" * 400_000 + b"}}"
    resp = coordinator_client.post(
        "/api/v1/jobs", data=bomb, content_type="application/json", headers=AUTH
    )
    assert resp.status_code == 413 and "arrays and objects" in resp.json["message"]


@pytest.mark.parametrize(
    ("data", "depth"),
    [
        (b"1", 0),
        (b"{}", 1),
        (b"[[], {}, [[]]]", 3),
        (b'{"a": {"b": [1, 2, {"c": []}]}}', 5),
        # Brackets, commas and quotes inside strings are not structure.
        (b'{"a": "[[[{{{", "b": ["]]]", "}"]}', 2),
        (b'["a\\"[[[", "\\\\", ["\\\\\\"]"]]', 2),
        (b'{"\\u005b": [[[]]]}', 4),
        # Not JSON: unbalanced brackets, or strings with nothing between them.
        (b"[[[", 9),
        (b"[}", 9),
        (b'["a""b""c""d""e""f""g""h"]', 9),
    ],
)
def test_nesting_reads_the_structure_not_the_strings(data, depth):
    assert nesting(structure(data), 8) == depth


def test_a_body_within_every_count_but_too_deep_is_a_400():
    limit = Heartbeat.body_limit
    with pytest.raises(ApiError) as refused:
        check_shape(b'{"tasks": [[[[[]]]]]}', limit)
    assert refused.value.status == 400
    check_shape(b'{"tasks": [{"progress": {}, "unusable_segments": []}]}', limit)
