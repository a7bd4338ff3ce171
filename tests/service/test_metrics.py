"""Prometheus metrics: every service's `/metrics`, scraped from real processes during
a short CartPole DQN job, parses and shows its counters moving; the metrics secret
reads `/metrics` and nothing else; requests are labelled by route, never by path;
each service instance counts in its own registry; the scrape config matches the pod
annotations."""

import secrets
from pathlib import Path

import numpy as np
import pytest
import yaml
from prometheus_client import generate_latest

from common.config import deep_merge
from common.errors import ApiError
from common.http_client import ServiceUnavailable
from common.messages import InsertReply, SegmentRef, new_id
from common.metrics import service_registry
from common.storage import SharedStore
from drover.local import LocalCluster
from jobconfig import load_config_file
from services.collector.metrics import CollectorMetrics
from services.collector.uploader import PendingSegment, SegmentUploader
from services.coordinator.app import create_app
from services.coordinator.settings import CoordinatorSettings
from services.learner.metrics import LearnerMetrics
from services.slave.app import create_slave_app
from services.slave.core import Slave
from tests.buffer_hosts import make_coordinator
from tests.fakes import BlockingRunner, CollectTaskContext, FakeCoordinator
from tests.helpers import parse_metrics, scrape, total, wait_until

ROOT = Path(__file__).resolve().parents[2]
#: The example job, made to train sooner and to evaluate never (no eval tasks).
CONFIG = deep_merge(
    load_config_file(ROOT / "examples" / "cartpole_dqn.yaml"),
    {
        "policy": {
            "learn": {"publish_every_iters": 20},
            "eval": {"evaluator": {"eval_freq": 1_000_000}},
            "other": {"replay_buffer": {"min_size_to_sample": 200}},
        }
    },
)
TOKEN = "test-token"
METRICS_TOKEN = "test-metrics-token"

#: name -> type, as `text_string_to_metric_families` names them (counters without
#: their `_total`).
EVERY_SERVICE = {
    "drover_http_requests": "counter",
    "drover_http_request_duration_seconds": "histogram",
    "process_resident_memory_bytes": "gauge",
    "process_cpu_seconds": "counter",
    "process_start_time_seconds": "gauge",
}
COORDINATOR = {
    **EVERY_SERVICE,
    "drover_samples_served": "counter",
    "drover_sample_wait_seconds": "histogram",
    "drover_sample_timeouts": "counter",
    "drover_segments_inserted": "counter",
    "drover_inserts_rate_limited": "counter",
    "drover_inserts_busy": "counter",
    "drover_lease_expiries": "counter",
    "drover_tasks_assigned": "counter",
    "drover_tasks_ended": "counter",
    "drover_job_env_steps": "gauge",
    "drover_job_train_iters": "gauge",
    "drover_job_policy_version": "gauge",
    "drover_job_buffer_size": "gauge",
    "drover_workers": "gauge",
}
COLLECTOR = {
    **EVERY_SERVICE,
    "drover_env_steps": "counter",
    "drover_segments_written": "counter",
    "drover_segment_bytes": "counter",
    "drover_insert_retries": "counter",
    "drover_tasks": "counter",
}
LEARNER = {
    **EVERY_SERVICE,
    "drover_train_iterations": "counter",
    "drover_policy_version": "gauge",
    "drover_policy_publishes": "counter",
    "drover_checkpoint_writes": "counter",
    "drover_checkpoint_bytes": "counter",
    "drover_learner_group_restarts": "gauge",
    "drover_tasks": "counter",
}


def check_types(families, expected, service):
    missing = sorted(set(expected) - set(families))
    assert not missing, f"{service} lacks {missing}"
    wrong = {n: families[n].type for n, t in expected.items() if families[n].type != t}
    assert not wrong, f"{service}: wrong types {wrong}"


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_every_service_metrics_move_during_a_job(tmp_path):
    env = {"DROVER_METRICS_TOKEN": METRICS_TOKEN, "DROVER_HEARTBEAT_INTERVAL_S": "0.5"}
    with LocalCluster(tmp_path / "run", num_collectors=1, extra_env=env) as cluster:
        cluster.wait_for_workers(timeout_s=60)
        job_id = cluster.client.submit_job(CONFIG, name="metrics").job_id
        urls = {
            "coordinator": cluster.coordinator_url,
            "collector": cluster.collectors[0].url,
            "learner": cluster.learners[0].url,
        }
        expected = {"coordinator": COORDINATOR, "collector": COLLECTOR, "learner": LEARNER}

        def scrape_all():
            dead = cluster.dead_services()
            assert not dead, f"{dead[0].name} died:\n{dead[0].log_tail()}"
            return {name: scrape(url, METRICS_TOKEN) for name, url in urls.items()}

        def training():
            scraped = scrape_all()
            moving = (
                total(scraped["learner"], "drover_train_iterations") > 0
                and total(scraped["coordinator"], "drover_samples_served", job_id=job_id) > 0
            )
            return scraped if moving else None

        first = wait_until(training, 40, "the learner to train")

        def moved():
            scraped = scrape_all()
            later = [
                ("collector", "drover_env_steps"),
                ("collector", "drover_segments_written"),
                ("learner", "drover_train_iterations"),
                ("coordinator", "drover_samples_served"),
            ]
            ok = all(total(scraped[s], n) > total(first[s], n) for s, n in later)
            return scraped if ok else None

        second = wait_until(moved, 20, "the counters to move")
        cluster.client.stop_job(job_id)

    for name, families in (*first.items(), *second.items()):
        check_types(families, expected[name], name)
    for name in urls:
        before, after = first[name], second[name]
        assert total(after, "drover_http_requests", service=name) > total(
            before, "drover_http_requests", service=name
        ), name
        # Routes are URL rules, never paths with ids in them.
        routes = {s.labels["route"] for s in after["drover_http_requests"].samples}
        assert not [r for r in routes if job_id in r], routes
        assert total(after, "process_resident_memory_bytes") > 0
    coordinator, collector, learner = second["coordinator"], second["collector"], second["learner"]
    # The job's data went to its buffer process, not through the coordinator, which
    # counts it from the process's reports under the same names.
    routes = {s.labels["route"] for s in coordinator["drover_http_requests"].samples}
    assert not {"/api/v1/jobs/<job_id>/samples", "/api/v1/jobs/<job_id>/segments"} & routes
    assert total(coordinator, "drover_segments_inserted", job_id=job_id) > 0
    assert total(coordinator, "drover_tasks_assigned", kind="collect") >= 1
    assert total(coordinator, "drover_tasks_assigned", kind="learn") >= 1
    assert total(coordinator, "drover_job_env_steps", job_id=job_id) > 0
    assert total(coordinator, "drover_workers") == 2
    assert total(collector, "drover_segment_bytes") > total(
        first["collector"], "drover_segment_bytes"
    )
    assert total(learner, "drover_policy_version") >= 1
    assert total(learner, "drover_policy_publishes") >= 1
    assert total(learner, "drover_learner_group_restarts") == 0


# --- the metrics secret, and labels, through Flask's test client ----------------------


def bearer(secret):
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def coordinator_client(tmp_path):
    settings = CoordinatorSettings(shared_dir=tmp_path, token=TOKEN, metrics_token=METRICS_TOKEN)
    return create_app(settings, core=make_coordinator(SharedStore(tmp_path))).test_client()


def test_the_metrics_secret_reads_metrics_and_nothing_else(coordinator_client):
    client = coordinator_client
    assert client.get("/metrics").status_code == 401
    resp = client.get("/metrics", headers=bearer(METRICS_TOKEN))
    assert resp.status_code == 200
    parse_metrics(resp.data.decode())
    for method, path in (("GET", "/api/v1/jobs"), ("GET", "/api/v1/workers")):
        resp = client.open(path, method=method, headers=bearer(METRICS_TOKEN))
        assert resp.status_code == 403 and resp.json["error"] == "forbidden", path
    assert client.get("/metrics", headers=bearer("wrong")).status_code == 401


def test_requests_are_counted_by_route_method_and_status(coordinator_client):
    client = coordinator_client
    job = new_id("job")
    client.get(f"/api/v1/jobs/{job}", headers=bearer(TOKEN))  # 404: no such job
    client.get(f"/no/such/{secrets.token_hex(4)}", headers=bearer(TOKEN))  # no such route
    client.get("/api/v1/jobs")  # 401, refused before any view
    families = parse_metrics(client.get("/metrics", headers=bearer(TOKEN)).data.decode())
    requests_total = families["drover_http_requests"]
    counted = {
        (s.labels["route"], s.labels["method"], s.labels["status"])
        for s in requests_total.samples
        if s.name == "drover_http_requests_total"
    }
    assert ("/api/v1/jobs/<job_id>", "GET", "404") in counted
    assert ("unmatched", "GET", "404") in counted
    assert ("/api/v1/jobs", "GET", "401") in counted
    assert all(s.labels["service"] == "coordinator" for s in requests_total.samples)
    durations = families["drover_http_request_duration_seconds"]
    counts = [
        s
        for s in durations.samples
        if s.name.endswith("_count") and s.labels["route"] == "/api/v1/jobs/<job_id>"
    ]
    assert counts and counts[0].value == 1


def test_a_slave_counts_in_its_own_registry(tmp_path):
    """Two slaves in one process: each app counts its own requests, none collide."""
    slaves = [
        Slave(
            role="collector",
            runner=BlockingRunner(),
            coordinator=FakeCoordinator(),
            advertise_url="http://127.0.0.1:8100",
            shared_root=tmp_path,
        )
        for _ in range(2)
    ]
    clients = [create_slave_app("c", s, TOKEN, METRICS_TOKEN).test_client() for s in slaves]
    clients[0].get("/healthz")
    clients[0].get("/healthz")
    seen = []
    for client in clients:
        families = parse_metrics(
            client.get("/metrics", headers=bearer(METRICS_TOKEN)).data.decode()
        )
        check_types(families, {**EVERY_SERVICE, "drover_tasks": "counter"}, "slave")
        seen.append(total(families, "drover_http_requests", route="/healthz"))
        assert client.get("/v1/status", headers=bearer(METRICS_TOKEN)).status_code == 403
    assert seen == [2, 0]


def test_the_scrape_config_reads_the_annotations_the_pods_carry():
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    pods = jobs["drover-pods"]
    annotations = {
        label.removeprefix("__meta_kubernetes_pod_annotation_")
        for rule in pods["relabel_configs"]
        for label in rule.get("source_labels", [])
        if label.startswith("__meta_kubernetes_pod_annotation_")
    }
    assert annotations == {"prometheus_io_scrape", "prometheus_io_path", "prometheus_io_port"}
    for name in ("coordinator", "collector", "learner"):
        docs = yaml.safe_load_all((ROOT / "deploy" / "k8s" / "base" / f"{name}.yaml").read_text())
        (deployment,) = [d for d in docs if d and d["kind"] == "Deployment"]
        template = deployment["spec"]["template"]
        pod_annotations = template["metadata"]["annotations"]
        (port,) = template["spec"]["containers"][0]["ports"]
        assert pod_annotations["prometheus.io/scrape"] == "true", name
        assert pod_annotations["prometheus.io/path"] == "/metrics", name
        assert int(pod_annotations["prometheus.io/port"]) == port["containerPort"], name
    static = {
        target
        for job in config["scrape_configs"]
        for group in job.get("static_configs", [])
        for target in group["targets"]
    }
    assert static == {"coordinator:8000", "learner:8200"}
    assert all("authorization" in job for job in config["scrape_configs"])


class _Store:
    def write_segment(self, *args, **kwargs):
        return 1000  # bytes


class _BusyThenAccepting:
    """429 (retry in 10 ms), then unreachable, then accepted."""

    def __init__(self):
        self.answers = [
            ApiError(429, "rate_limited", "the learner is behind", retry_after_s=0.01),
            ServiceUnavailable("connection refused"),
        ]

    def insert_segments(self, *args, **kwargs):
        if self.answers:
            raise self.answers.pop(0)
        return InsertReply(accepted=1, duplicates=0, env_steps=8)


@pytest.mark.timeout(20)
def test_the_uploader_counts_segments_bytes_and_retries_by_reason():
    registry = service_registry()
    uploader = SegmentUploader(
        CollectTaskContext(_BusyThenAccepting()),
        _Store(),
        insert_timeout_s=0.0,
        metrics=CollectorMetrics(registry),
    )
    ref = SegmentRef(
        path="job-1/segments/w.collect-1/00000000.safetensors",
        rows=8,
        env_steps=8,
        policy_version=0,
    )
    uploader.put(PendingSegment(columns={"obs": np.zeros((8, 4), np.float32)}, ref=ref))
    uploader.close()
    assert uploader.segments_sent == 1 and uploader.error is None
    families = parse_metrics(generate_latest(registry).decode())
    assert total(families, "drover_segments_written") == 1
    assert total(families, "drover_segment_bytes") == 1000
    assert total(families, "drover_insert_retries", reason="rate_limited") == 1
    assert total(families, "drover_insert_retries", reason="transient") == 1


def test_a_learner_group_shows_torchruns_restart_count(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    registry = service_registry()
    LearnerMetrics(registry)
    families = parse_metrics(generate_latest(registry).decode())
    assert total(families, "drover_learner_group_restarts") == 3
