import numpy as np
import pytest
import requests

from common.array_bodies import CONTENT_TYPE as ARRAYS_TYPE
from common.array_bodies import SAMPLE_REQUEST_ARRAYS, SampledItems, encode, frame
from common.messages import SampleRequest
from common.storage import SharedStore
from services.coordinator.app import create_app
from services.coordinator.core import CoordinatorLimits
from services.coordinator.settings import CoordinatorSettings
from tests.buffer_hosts import buffer_of, make_coordinator, read_reports
from tests.coordinator_app import (
    AUTH,
    CONFIG,
    TOKEN,
    get,
    insert_segments,
    post,
    register,
    submit,
    write_segment,
)
from tests.helpers import wait_until

SMALL_BUFFER = {
    "policy": {"other": {"replay_buffer": {"replay_buffer_size": 100, "min_size_to_sample": 10}}}
}


# --- auth and error format ------------------------------------------------------


def test_health_is_public_everything_else_needs_the_token(client):
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        resp = client.get("/api/v1/jobs", headers=headers)
        assert resp.status_code == 401
        assert resp.json["error"] == "unauthorized"


def test_errors_are_json_never_html(client):
    resp = get(client, "/api/v1/nothing-here")
    assert resp.status_code == 404 and resp.is_json
    resp = client.put("/api/v1/jobs", headers=AUTH)
    assert resp.status_code == 405 and resp.json["error"] == "method_not_allowed"
    resp = client.post("/api/v1/jobs", data="{bad", headers=AUTH, content_type="application/json")
    assert resp.status_code == 400 and resp.is_json
    resp = client.post("/api/v1/jobs", data="x", headers=AUTH, content_type="text/plain")
    assert resp.status_code == 415
    resp = client.post(
        "/api/v1/jobs", data=b"0" * (9 * 1024 * 1024), headers=AUTH, content_type="application/json"
    )
    assert resp.status_code == 413 and resp.is_json


# --- jobs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"config": {"policy": {"learn": {"batch_size": -1}}}}, "config.policy.learn.batch_size"),
        ({"config": {"env": {"env_id": "NoSuchEnv-v9"}}}, "config.env.env_id"),
        ({"config": {"env": {"env_id": "Pendulum-v1"}}}, "config.env.env_id"),
        ({"config": "x"}, "config"),
        ({}, "config"),
        ({"config": {}, "extra": 1}, "extra"),
        (
            {"config": {"policy": {"other": {"replay_buffer": {"replay_buffer_size": 5000}}}}},
            "config.policy.other.replay_buffer.replay_buffer_size",
        ),
        (
            {"config": {**SMALL_BUFFER, "system": {"collector_num": 1000}}},
            "config.system.collector_num",
        ),
        (
            {"config": {**SMALL_BUFFER, "env": {"collector_env_num": 1000}}},
            "config.env.collector_env_num",
        ),
    ],
)
def test_bad_job_configs_get_400_naming_the_field(client, body, field):
    resp = post(client, "/api/v1/jobs", body)
    assert resp.status_code == 400, resp.json
    assert resp.json["message"].startswith(field), resp.json


def test_job_lifecycle(client, core):
    typo = post(client, "/api/v1/jobs", {"config": {**CONFIG, "typo_key": 1}})
    assert typo.status_code == 400 and typo.json["message"].startswith("config.typo_key:")
    assert get(client, "/api/v1/jobs").json["jobs"] == []  # nothing was made
    resp = post(client, "/api/v1/jobs", {"config": {**CONFIG, "typo_key": 1, "strict": False}})
    assert resp.status_code == 201
    assert resp.json["warnings"] == ["typo_key: unknown key"]
    job_id = resp.json["job_id"]
    assert core.store.read_json(f"{job_id}/job.json")["policy"]["model"]["obs_shape"] == 4
    assert [j["job_id"] for j in get(client, "/api/v1/jobs").json["jobs"]] == [job_id]
    status = get(client, f"/api/v1/jobs/{job_id}").json
    assert status["phase"] == "running" and status["env_id"] == "CartPole-v1"
    assert get(client, "/api/v1/jobs/job-nope").status_code == 404
    resp = client.delete(f"/api/v1/jobs/{job_id}", headers=AUTH)
    assert resp.status_code == 202 and resp.json["phase"] == "stopped"
    metrics = get(client, f"/api/v1/jobs/{job_id}/metrics").json
    assert metrics["buffer"]["capacity"] == 100
    assert core.store.read_json(f"{job_id}/summary.json")["phase"] == "stopped"
    assert client.delete("/api/v1/jobs/job-nope", headers=AUTH).status_code == 404


# --- workers and scheduling -----------------------------------------------------------


def test_workers_register_heartbeat_and_leave(client, core):
    bad = register(client, "boss", "http://x")
    assert bad.status_code == 400 and bad.json["message"].startswith("role")
    reg = register(client, "collector", "http://127.0.0.1:1")
    assert reg.status_code == 201
    worker_id = reg.json["worker_id"]
    assert reg.json["lease_timeout_s"] > reg.json["heartbeat_interval_s"] > 0
    beat = post(client, f"/api/v1/workers/{worker_id}/heartbeat", {"tasks": []})
    assert beat.status_code == 200 and beat.json == {"cancel": [], "release": [], "credentials": {}}
    unknown = post(
        client,
        f"/api/v1/workers/{worker_id}/heartbeat",
        {"tasks": [{"task_id": "collect-zzz", "state": "running"}]},
    )
    assert unknown.json["cancel"] == ["collect-zzz"]  # not ours: stop it
    workers = get(client, "/api/v1/workers").json["workers"]
    assert workers[0]["worker_id"] == worker_id and workers[0]["state"] == "idle"
    assert client.delete(f"/api/v1/workers/{worker_id}", headers=AUTH).status_code == 202
    gone = post(client, f"/api/v1/workers/{worker_id}/heartbeat", {"tasks": []})
    assert gone.status_code == 404  # forgotten: register again
    assert client.delete(f"/api/v1/workers/{worker_id}", headers=AUTH).status_code == 404


def test_scheduler_plans_collect_and_learn_tasks(client, core):
    job_id = submit(client)
    c = register(client, "collector", "http://c").json
    learner = register(client, "learner", "http://l").json
    plan = core.plan()
    kinds = sorted((d.url, d.task.kind) for d in plan)
    assert kinds == [("http://c", "collect"), ("http://l", "learn")]
    assert all(d.task.job_id == job_id for d in plan)
    assert core.plan() == []  # nothing more to do
    for d in plan:
        core.dispatched(d.task.task_id)
    collect = next(d.task for d in plan if d.task.kind == "collect")
    beat = post(
        client,
        f"/api/v1/workers/{c['worker_id']}/heartbeat",
        {"tasks": [{"task_id": collect.task_id, "state": "running", "progress": {"env_steps": 5}}]},
    )
    # Its buffer credential, signed anew (credentials expire).
    assert beat.json["cancel"] == [] and beat.json["release"] == []
    assert list(beat.json["credentials"]) == [collect.task_id]
    # a worker that leaves hands its task back: the next plan gives it to another
    client.delete(f"/api/v1/workers/{c['worker_id']}", headers=AUTH)
    register(client, "collector", "http://c2")
    assert [(d.url, d.task.kind) for d in core.plan()] == [("http://c2", "collect")]
    assert learner["worker_id"].startswith("learner-")


# --- data plane ---------------------------------------------------------------------


def test_segments_insert_dedupe_and_refusals(client, core):
    job_id = submit(client)
    seg = write_segment(core, job_id, 0)
    url = f"/api/v1/jobs/{job_id}/segments"
    first = post(client, url, {"segments": [seg]})
    assert first.status_code == 200 and first.json == {
        "accepted": 1,
        "duplicates": 0,
        "env_steps": 10,
    }
    again = post(client, url, {"segments": [seg]})
    assert again.json == {"accepted": 0, "duplicates": 1, "env_steps": 10}
    cases = [
        ({**seg, "path": f"{job_id}/segments/w1/00000009.safetensors"}, "no file"),
        ({**seg, "path": f"{job_id}/segments/../job.json"}, "relative, normalized"),
        ({**seg, "path": "/etc/passwd"}, "relative"),
        ({**seg, "path": f"{job_id}/job.json"}, "outside"),
        ({**seg, "rows": 0}, "segments.0.rows"),
    ]
    for bad, words in cases:
        resp = post(client, url, {"segments": [bad]})
        assert resp.status_code == 400 and words in resp.json["message"], (bad, resp.json)
    assert post(client, url, {"segments": []}).status_code == 400
    assert post(client, "/api/v1/jobs/job-nope/segments", {"segments": [seg]}).status_code == 404
    client.delete(f"/api/v1/jobs/{job_id}", headers=AUTH)
    late = post(client, url, {"segments": [write_segment(core, job_id, 1)]})
    assert late.status_code == 409 and late.json["error"] == "job_finished"


def test_samples_long_poll_timeout_then_batches(client, core):
    job_id = submit(client)
    url = f"/api/v1/jobs/{job_id}/samples"
    early = post(client, url, {"batch_size": 4, "num_batches": 2, "timeout_s": 0})
    assert early.status_code == 503 and early.json["error"] == "sample_timeout"
    insert_segments(client, core, job_id, 3)
    resp = post(client, url, {"batch_size": 4, "num_batches": 2, "timeout_s": 1})
    assert resp.status_code == 200
    batches = resp.json["batches"]
    assert len(batches) == 2 and all(len(b["keys"]) == 4 == len(b["weights"]) for b in batches)
    for bad in (
        {"batch_size": 0},
        {"batch_size": 10**6},
        {"batch_size": 4, "timeout_s": 3600},
        {"batch_size": "4"},
        {"batch_size": 4, "num_batches": -1},
    ):
        resp = post(client, url, bad)
        assert resp.status_code == 400, bad
    pr = post(client, f"/api/v1/jobs/{job_id}/priorities", {"keys": [0, 1], "priorities": [1.0]})
    assert pr.status_code == 400
    pr = post(
        client,
        f"/api/v1/jobs/{job_id}/priorities",
        {"keys": [*batches[0]["keys"][:2], 12345], "priorities": [1.0, 2.0, 3.0]},
    )
    assert pr.status_code == 200 and pr.json == {"updated": 2}  # an unknown key is ignored
    neg = post(client, f"/api/v1/jobs/{job_id}/priorities", {"keys": [0], "priorities": [-1.0]})
    assert neg.status_code == 400


def test_priorities_sent_with_a_sample_request_are_applied_before_it_samples(client, core):
    job_id = submit(client)
    url = f"/api/v1/jobs/{job_id}/samples"
    insert_segments(client, core, job_id, 3)
    keys = post(client, url, {"batch_size": 4, "timeout_s": 1}).json["batches"][0]["keys"]
    buffer = buffer_of(core, job_id)

    def priority(key):
        slots, _ = buffer.table.slots_of(np.array([key]))
        return float(buffer.table.priority[slots[0]])

    before = priority(keys[0])
    resp = post(
        client,
        url,
        {"batch_size": 4, "timeout_s": 1, "priority_keys": keys[:2], "priorities": [7.0, 9.0]},
    )
    assert resp.status_code == 200, resp.json
    assert priority(keys[0]) != before
    assert priority(keys[1]) - priority(keys[0]) == pytest.approx(2.0)
    for bad, field in (
        ({"priority_keys": keys[:2], "priorities": [1.0]}, "priorities"),
        ({"priority_keys": [keys[0]], "priorities": [-1.0]}, "priorities"),
        ({"priority_keys": [-5], "priorities": [1.0]}, "priority_keys"),
    ):
        resp = post(client, url, {"batch_size": 4, "timeout_s": 1, **bad})
        assert resp.status_code == 400 and field in resp.json["message"], (bad, resp.json)
    assert priority(keys[1]) - priority(keys[0]) == pytest.approx(2.0)  # nothing applied


# --- policies, evaluation, stop -------------------------------------------------------


def test_policy_versions_are_monotonic_and_served(client, core):
    job_id = submit(client)
    url = f"/api/v1/jobs/{job_id}/policies"
    assert get(client, f"{url}/latest").status_code == 204
    assert get(client, f"/api/v1/jobs/{job_id}/policy").status_code == 404
    path, sha = core.store.write_policy(job_id, 1, 10, "dqn", {"w": np.ones(2, np.float32)})
    missing = post(
        client, url, {"version": 2, "path": core.store.policy_path(job_id, 2), "sha256": sha}
    )
    assert missing.status_code == 400
    wrong = post(client, url, {"version": 1, "path": f"{job_id}/job.json", "sha256": sha})
    assert wrong.status_code == 400
    ok = post(client, url, {"version": 1, "path": path, "sha256": sha, "train_iter": 10})
    assert ok.status_code == 201
    assert get(client, f"{url}/latest").json["version"] == 1
    stale = post(client, url, {"version": 1, "path": path, "sha256": sha})
    assert stale.status_code == 409 and stale.json["error"] == "stale_version"
    blob = get(client, f"/api/v1/jobs/{job_id}/policy")
    assert blob.status_code == 200 and blob.mimetype == "application/octet-stream"
    assert blob.data == core.store.read_bytes(path)
    assert get(client, f"/api/v1/jobs/{job_id}/policy?version=7").status_code == 404
    assert get(client, f"/api/v1/jobs/{job_id}/policy?version=x").status_code == 400


def test_evaluation_result_reaching_stop_value_succeeds_the_job(client, core):
    job_id = submit(client)
    c = register(client, "collector", "http://c").json
    collect_ids = []
    for dispatch in core.plan():
        core.dispatched(dispatch.task.task_id)  # the collector took its collect task
        collect_ids.append(dispatch.task.task_id)
    path, sha = core.store.write_policy(job_id, 1, 10, "dqn", {"w": np.ones(2, np.float32)})
    post(
        client,
        f"/api/v1/jobs/{job_id}/policies",
        {"version": 1, "path": path, "sha256": sha, "train_iter": 10},
    )
    evaluate = [d.task for d in core.plan() if d.task and d.task.kind == "evaluate"]
    assert len(evaluate) == 1 and evaluate[0].spec.policy_version == 1
    task_id = evaluate[0].task_id
    bad = post(client, f"/api/v1/tasks/{task_id}/complete", {"result": {"policy_version": 1}})
    assert bad.status_code == 400 and "result.returns" in bad.json["message"]
    done = post(
        client,
        f"/api/v1/tasks/{task_id}/complete",
        {"result": {"policy_version": 1, "returns": [140.0, 180.0], "lengths": [140, 180]}},
    )
    assert done.status_code == 200
    status = get(client, f"/api/v1/jobs/{job_id}").json
    assert status["phase"] == "succeeded"
    assert status["last_eval"]["return_mean"] == 160.0 and status["best_policy_version"] == 1
    assert core.store.read_json(f"{job_id}/policies/best.json")["version"] == 1
    # a late message for the finished task is refused, not counted again
    late = post(client, f"/api/v1/tasks/{task_id}/complete", {"result": {}})
    assert late.status_code == 409
    assert post(client, "/api/v1/tasks/nope/fail", {"error": "x"}).status_code == 404
    # the job's collect task is cancelled through the heartbeat answer; it left the
    # task map, and is remembered as cancelled
    (collect_id,) = collect_ids
    assert collect_id not in core.tasks and core.task_state(collect_id) == "cancelled"
    beat = post(
        client,
        f"/api/v1/workers/{c['worker_id']}/heartbeat",
        {"tasks": [{"task_id": collect_id, "state": "running"}]},
    )
    assert beat.json["cancel"] == [collect_id]


def test_repeated_task_failures_fail_the_job(client, core):
    job_id = submit(client)
    for i in range(core.limits.max_task_failures):
        register(client, "learner", f"http://l{i}")
        learn = next(d.task for d in core.plan() if d.task and d.task.kind == "learn")
        assert (
            post(client, f"/api/v1/tasks/{learn.task_id}/fail", {"error": "boom"}).status_code
            == 200
        )
    status = get(client, f"/api/v1/jobs/{job_id}").json
    assert status["phase"] == "failed" and "boom" in status["reason"]


def test_max_env_step_ends_the_job(client, core):
    job_id = submit(client, {**CONFIG, "system": {"max_env_step": 15}})
    url = f"/api/v1/jobs/{job_id}/segments"
    post(client, url, {"segments": [write_segment(core, job_id, 0)]})
    read_reports(core)  # what its buffer process counted
    assert get(client, f"/api/v1/jobs/{job_id}").json["phase"] == "running"
    post(client, url, {"segments": [write_segment(core, job_id, 1)]})
    read_reports(core)
    status = get(client, f"/api/v1/jobs/{job_id}").json
    assert status["phase"] == "failed" and "max_env_step 15" in status["reason"]


def test_prometheus_metrics(client):
    submit(client)
    resp = get(client, "/metrics")
    assert resp.status_code == 200 and b"drover_job_env_steps" in resp.data


def test_buffer_stats_route(client, core):
    job_id = submit(client)
    insert_segments(client, core, job_id, 3)
    post(client, f"/api/v1/jobs/{job_id}/samples", {"batch_size": 5, "num_batches": 2})
    stats = get(client, f"/api/v1/jobs/{job_id}/buffer").json
    assert stats["size"] == 30 and stats["capacity"] == 100 and stats["inserts"] == 30
    assert stats["samples"] == 10 and stats["sample_requests"] == 1
    assert stats["samples_per_insert_ratio"] == pytest.approx(1 / 3)
    assert stats["limiter"]["min_size_to_sample"] == 20 and stats["can_sample"] is True
    assert set(stats["evictions"]) == {"capacity", "max_use", "staleness"}
    assert get(client, "/api/v1/jobs/job-nope/buffer").status_code == 404


def test_a_finished_job_leaves_no_segment_files(client, core):
    job_id = submit(client)
    insert_segments(client, core, job_id, 3)
    # a collector's write that raced the end of the job, never inserted
    write_segment(core, job_id, 99, worker="late")
    client.delete(f"/api/v1/jobs/{job_id}", headers=AUTH)
    left = sorted(p.name for p in (core.store.root / job_id / "segments").rglob("*.safetensors"))
    assert left == ["00000099.safetensors"]  # only the unindexed one, until the sweep
    core.close()  # shutdown (or the sweep delay) removes the folder
    assert not (core.store.root / job_id / "segments").exists()
    assert (core.store.root / job_id / "summary.json").is_file()


@pytest.mark.parametrize(
    ("replay", "field"),
    [
        ({"samples_per_insert": 8, "error_buffer": 10}, "error_buffer"),
        ({"min_size_to_sample": 500}, "min_size_to_sample"),
        ({"type": "fifo", "replay_buffer_size": 100}, "config.policy.learn.num_batches"),
        ({"sequence_length": 4}, "sequence_length"),
    ],
)
def test_settings_that_could_deadlock_are_refused_at_submission(client, replay, field):
    buffer = {"replay_buffer_size": 100, "min_size_to_sample": 20, **replay}
    config = {**CONFIG, "policy": {"other": {"replay_buffer": buffer}}}
    resp = post(client, "/api/v1/jobs", {"config": config})
    assert resp.status_code == 400
    assert field in resp.json["message"], resp.json


def test_insert_over_the_band_gets_429_with_retry_after(client, core):
    limited = {
        "samples_per_insert": 1.0,
        "error_buffer": 20.0,
        "min_size_to_sample": 10,
        "replay_buffer_size": 100,
    }
    config = {
        **CONFIG,
        "policy": {
            "learn": {"batch_size": 5, "num_batches": 2},
            "collect": {"n_sample": 10},
            "other": {"replay_buffer": limited},
        },
    }
    job_id = submit(client, config)
    url = f"/api/v1/jobs/{job_id}/segments"
    accepted = 0
    for seq in range(6):
        resp = post(client, url, {"segments": [write_segment(core, job_id, seq)], "timeout_s": 0})
        if resp.status_code == 429:
            break
        accepted += 1
    assert resp.status_code == 429 and resp.json["error"] == "rate_limited"
    assert int(resp.headers["Retry-After"]) >= 1 and resp.json["retry_after_s"] > 0
    assert accepted == 3  # min_size (10) + a band of 20 samples' worth
    # the learner samples: the same insert now goes through, counted once
    sampled = post(client, f"/api/v1/jobs/{job_id}/samples", {"batch_size": 5, "num_batches": 2})
    assert sampled.status_code == 200
    retry = post(client, url, {"segments": [write_segment(core, job_id, seq)], "timeout_s": 0})
    assert retry.json == {"accepted": 1, "duplicates": 0, "env_steps": 40}


def test_max_policy_lag_bounds_what_is_trained_on(client, core):
    job_id = submit(client, {**CONFIG, "system": {"max_policy_lag": 1}})
    insert_segments(client, core, job_id, 3)  # collected by version 0
    for version in (1, 2):
        path, sha = core.store.write_policy(job_id, version, 10, "dqn", {"w": np.ones(2)})
        post(
            client,
            f"/api/v1/jobs/{job_id}/policies",
            {"version": version, "path": path, "sha256": sha},
        )
    stats = get(client, f"/api/v1/jobs/{job_id}/buffer").json
    assert stats["size"] == 0 and stats["evictions"]["staleness"] == 30


def evaluate_job(client, core, **evaluate):
    config = {
        "env": {"env_id": "CartPole-v1", "evaluator_env_num": 2},
        "system": {"workflow": "evaluate", "evaluate": {"episodes": 10, **evaluate}},
    }
    return submit(client, config)


def test_evaluate_workflow_shares_episodes_and_writes_results(client, core):
    for i in range(3):
        register(client, "collector", f"http://c{i}")
    register(client, "learner", "http://l")
    job_id = evaluate_job(client, core)
    plan = core.plan()
    assert sorted(d.task.spec.episodes for d in plan) == [3, 3, 4]
    assert {d.task.kind for d in plan} == {"evaluate"}  # no learning in this workflow
    assert all(d.task.spec.source == "random" for d in plan)
    # one collector fails: its episodes are handed out again
    first, second, third = (d.task for d in plan)
    post(client, f"/api/v1/tasks/{first.task_id}/fail", {"error": "crashed"})
    replanned = [d.task for d in core.plan()]
    assert [t.spec.episodes for t in replanned] == [first.spec.episodes]
    for task in (second, third, replanned[0]):
        n = task.spec.episodes
        result = {"policy_version": 0, "returns": [10.0] * n, "lengths": [10] * n}
        assert (
            post(client, f"/api/v1/tasks/{task.task_id}/complete", {"result": result}).status_code
            == 200
        )
    status = get(client, f"/api/v1/jobs/{job_id}").json
    assert status["phase"] == "succeeded" and status["last_eval"]["episodes"] == 10
    results = core.store.read_json(f"{job_id}/eval/results.json")
    assert len(results["episodes"]) == 10 and results["source"] == "random"
    csv_rows = core.store.read_bytes(f"{job_id}/eval/results.csv").decode().splitlines()
    assert csv_rows[0] == "episode,return,length,task_id,seed" and len(csv_rows) == 11


@pytest.mark.parametrize(
    ("evaluate", "words"),
    [
        ({"source": "policy"}, "needs a path"),
        ({"source": "policy", "path": "job-x/policies/00000001.safetensors"}, "no file"),
        ({"source": "checkpoint", "path": "../../etc/passwd"}, "relative"),
    ],
)
def test_evaluate_workflow_refuses_missing_sources(client, core, evaluate, words):
    config = {"system": {"workflow": "evaluate", "evaluate": evaluate}}
    resp = post(client, "/api/v1/jobs", {"config": config})
    assert resp.status_code == 400 and "system.evaluate.path" in resp.json["message"]
    assert words in resp.json["message"]


def test_waiting_long_polls_are_bounded_per_job_and_in_all(client, core):
    import threading

    per_job, limit = core.limits.max_waiting_samples_per_job, core.limits.max_waiting_samples
    jobs = [submit(client) for _ in range(limit // per_job + 1)]

    def poll(c, job_id):
        return post(c, f"/api/v1/jobs/{job_id}/samples", {"batch_size": 4, "timeout_s": 3.0})

    waiting = [
        threading.Thread(target=lambda j=j: poll(client.application.test_client(), j))
        for j in jobs[:-1]
        for _ in range(per_job)
    ]
    for thread in waiting[:per_job]:
        thread.start()
    held = buffer_of(core, jobs[0])
    wait_until(lambda: held.stats().waiting_samplers == per_job, what="one job's long-polls")
    # One job's empty buffer takes its share of waiting requests, not the server's.
    resp = poll(client, jobs[0])
    assert resp.status_code == 503 and resp.json["error"] == "too_many_waiting"
    assert f"for job {jobs[0]}" in resp.json["message"] and "Retry-After" in resp.headers
    for thread in waiting[per_job:]:
        thread.start()
    wait_until(
        lambda: sum(buffer_of(core, j).stats().waiting_samplers for j in jobs) == limit,
        what="all long-polls waiting",
    )
    resp = poll(client, jobs[-1])
    assert resp.status_code == 503 and "in all" in resp.json["message"]
    for job_id in jobs:
        client.delete(f"/api/v1/jobs/{job_id}", headers=AUTH)  # wakes them all
    for thread in waiting:
        thread.join(5)
    assert core.waiting_samples == 0


def test_each_worker_has_its_own_credential_and_acts_only_as_itself(client, core):
    job_id = submit(client)
    a = register(client, "collector", "http://a").json
    b = register(client, "collector", "http://b").json
    learner = register(client, "learner", "http://l").json
    assert a["credential"] != b["credential"] and a["credential"].startswith(a["worker_id"])
    as_a = {"Authorization": f"Bearer {a['credential']}"}
    tasks = {d.url: d.task for d in core.plan()}

    def heartbeat(worker, headers):
        return client.post(
            f"/api/v1/workers/{worker['worker_id']}/heartbeat", json={"tasks": []}, headers=headers
        )

    assert heartbeat(a, as_a).status_code == 200
    forged = heartbeat(b, as_a)
    assert forged.status_code == 403 and forged.json["error"] == "forbidden"
    # B's task cannot be completed or failed with A's credential
    task_b = tasks["http://b"].task_id
    for route in ("complete", "fail"):
        body = {"result": {}} if route == "complete" else {"error": "x"}
        resp = client.post(f"/api/v1/tasks/{task_b}/{route}", json=body, headers=as_a)
        assert resp.status_code == 403
    # A may not act for B's task, wherever it sends; its own task's data goes where the
    # task says (its buffer process checks the folder: tests/service/test_buffer_process.py)
    task_a = tasks["http://a"].task_id
    own = write_segment(core, job_id, 0, worker=f"{a['worker_id']}.{task_a}")
    url = f"/api/v1/jobs/{job_id}/segments"
    resp = client.post(url, json={"segments": [own], "task_id": task_b}, headers=as_a)
    assert resp.status_code == 403
    resp = client.post(url, json={"segments": [own], "task_id": task_a}, headers=as_a)
    assert resp.status_code == 409 and resp.json["error"] == "data_elsewhere"
    # a learner announces only for its own learn task
    path, sha = core.store.write_policy(job_id, 1, 0, "dqn", {"w": np.ones(2)})
    learn = tasks["http://l"]
    announce = {"version": 1, "path": path, "sha256": sha, "task_id": learn.task_id}
    announce["epoch"] = learn.spec.epoch  # its lease's
    assert (
        client.post(f"/api/v1/jobs/{job_id}/policies", json=announce, headers=as_a).status_code
        == 403
    )
    as_learner = {"Authorization": f"Bearer {learner['credential']}"}
    assert (
        client.post(
            f"/api/v1/jobs/{job_id}/policies", json=announce, headers=as_learner
        ).status_code
        == 201
    )
    # a made-up credential, or one of a worker that left, is no credential
    assert heartbeat(a, {"Authorization": f"Bearer {a['worker_id']}.guess"}).status_code == 401
    client.delete(f"/api/v1/workers/{a['worker_id']}", headers=as_a)
    assert heartbeat(a, as_a).status_code == 401


def test_inserts_past_max_concurrent_are_busy_and_a_rate_limited_one_holds_no_slot(tmp_path):
    import threading

    core = make_coordinator(
        SharedStore(tmp_path), CoordinatorLimits(max_buffer_items=1000, max_concurrent_inserts=1)
    )
    client = create_app(CoordinatorSettings(shared_dir=tmp_path, token=TOKEN), core=core)
    client = client.test_client()
    limited = {"samples_per_insert": 1.0, "error_buffer": 20.0, "min_size_to_sample": 10}
    config = {
        **CONFIG,
        "policy": {
            "learn": {"batch_size": 5, "num_batches": 2},
            "collect": {"n_sample": 10},
            "other": {"replay_buffer": {**limited, "replay_buffer_size": 100}},
        },
    }
    held, free = submit(client, config), submit(client)

    def insert(job_id, seq, timeout_s=0.0, c=client):
        body = {"segments": [write_segment(core, job_id, seq)], "timeout_s": timeout_s}
        return post(c, f"/api/v1/jobs/{job_id}/segments", body)

    # An insert being indexed takes the one slot: the next is told to come back shortly.
    slot = core.data.insert_slots.take()
    resp = insert(free, 0)
    assert resp.status_code == 429 and resp.json["error"] == "busy", resp.json
    assert 0.1 <= resp.json["retry_after_s"] <= 0.3 and "Retry-After" in resp.headers
    assert "drover_inserts_busy_total 1.0" in get(client, "/metrics").text
    slot.release()
    slot.release()  # once only
    assert insert(free, 0).status_code == 200
    # At the job's buffer process, an insert the rate limiter holds waits for learners,
    # not for the host: it gives its slot back (a passed-on insert holds the
    # coordinator's until it is answered: an operator's tool sends timeout_s 0).
    for seq in range(3):  # min_size_to_sample and the band: the next one waits
        assert insert(held, seq).status_code == 200
    url = f"{core.jobs[held].replay.url}/api/v1/jobs/{held}/segments"

    def direct(seq, timeout_s):
        body = {"segments": [write_segment(core, held, seq)], "timeout_s": timeout_s}
        return requests.post(url, json=body, headers=AUTH, timeout=10)

    answers = []
    waiting = threading.Thread(target=lambda: answers.append(direct(3, 3.0)))
    waiting.start()
    buffer = buffer_of(core, held)
    wait_until(
        lambda: buffer.stats().waiting_inserters == 1 or answers,
        what="the held insert waiting",
    )
    assert not answers, answers[0].json()
    again = direct(4, 0.0)  # its one slot is free: rate limited, not busy
    assert again.status_code == 429 and again.json()["error"] == "rate_limited", again.json()
    assert insert(free, 1).status_code == 200
    assert core.data.insert_slots.taken == 0
    client.delete(f"/api/v1/jobs/{held}", headers=AUTH)  # wakes it
    waiting.join(5)


def test_an_evaluation_waits_for_env_steps_past_the_last_ones(client, core):
    """Evaluations are recorded at the job's env steps, one at a time: the next one is
    planned only once env steps have passed the last one's, so each has a step of its
    own (TensorBoard's axis), however far the learner trained meanwhile."""
    job_id = submit(client)
    register(client, "collector", "http://c")
    for dispatch in core.plan():
        core.dispatched(dispatch.task.task_id)
    insert_segments(client, core, job_id, 1)
    read_reports(core)

    def announce(version, train_iter):
        path, sha = core.store.write_policy(
            job_id, version, train_iter, "dqn", {"w": np.ones(2, np.float32)}
        )
        post(
            client,
            f"/api/v1/jobs/{job_id}/policies",
            {"version": version, "path": path, "sha256": sha, "train_iter": train_iter},
        )

    def evaluations():
        return [d.task for d in core.plan() if d.task and d.task.kind == "evaluate"]

    announce(1, 10)
    (first,) = evaluations()
    core.dispatched(first.task_id)
    result = {"policy_version": 1, "returns": [10.0, 12.0], "lengths": [10, 12]}
    done = post(client, f"/api/v1/tasks/{first.task_id}/complete", {"result": result})
    assert done.status_code == 200, done.json
    steps = get(client, f"/api/v1/jobs/{job_id}").json["last_eval"]["env_steps"]
    assert steps > 0
    announce(2, 50)  # four eval_freq later, and not one env step since
    assert evaluations() == []
    resp = post(
        client, f"/api/v1/jobs/{job_id}/segments", {"segments": [write_segment(core, job_id, 1)]}
    )
    assert resp.status_code == 200, resp.json
    read_reports(core)
    (second,) = evaluations()
    assert second.spec.policy_version == 2


def test_a_sample_in_binary_frames_both_ways_is_the_json_sample(client, core):
    """A learner's priorities as arrays in, keys, rows and weights as arrays out
    (common/array_bodies.py); errors stay JSON and name the field."""
    job_id = submit(client)
    url = f"/api/v1/jobs/{job_id}/samples"
    insert_segments(client, core, job_id, 3)
    frame_headers = {**AUTH, "Content-Type": ARRAYS_TYPE, "Accept": ARRAYS_TYPE}
    first = post(client, url, {"batch_size": 4, "num_batches": 2, "timeout_s": 1}).json
    keys = first["batches"][0]["keys"]
    request = SampleRequest(
        batch_size=4, num_batches=2, timeout_s=1, priority_keys=keys[:2], priorities=[7.0, 9.0]
    )
    resp = client.post(url, data=encode(request, SAMPLE_REQUEST_ARRAYS), headers=frame_headers)
    assert resp.status_code == 200 and resp.content_type == ARRAYS_TYPE
    reply = SampledItems.from_frame(resp.data).reply()
    assert len(reply.batches) == 2 and all(
        len(b.keys) == 4 == len(b.weights) for b in reply.batches
    )
    paths = {s.path for b in reply.batches for s in b.segments}
    assert paths and all(p.startswith(f"{job_id}/segments/") for p in paths)
    buffer = buffer_of(core, job_id)
    slots, _ = buffer.table.slots_of(np.array(keys[:2]))
    assert buffer.table.priority[slots[1]] - buffer.table.priority[slots[0]] == pytest.approx(2.0)
    # A JSON request may still ask for a frame, and a frame request for JSON.
    as_json = client.post(
        url,
        data=encode(request, SAMPLE_REQUEST_ARRAYS),
        headers={**AUTH, "Content-Type": ARRAYS_TYPE},
    )
    assert as_json.status_code == 200 and len(as_json.json["batches"]) == 2
    bad_dtype = frame(
        {"priority_keys": np.array(keys[:1], np.int32), "priorities": np.array([1.0])},
        '{"batch_size": 4, "timeout_s": 1}',
    )
    for body, field in (
        (bad_dtype, "priority_keys"),
        (
            frame(
                {"priority_keys": np.array([-5]), "priorities": np.array([1.0])},
                '{"batch_size": 4}',
            ),
            "priority_keys",
        ),
        (
            frame(
                {"priority_keys": np.array(keys[:1]), "priorities": np.array([np.nan])},
                '{"batch_size": 4}',
            ),
            "priorities",
        ),
        (
            frame(
                {"priority_keys": np.array(keys[:2]), "priorities": np.array([1.0])},
                '{"batch_size": 4}',
            ),
            "priorities",
        ),
        (frame({"rows": np.array([1])}, '{"batch_size": 4}'), "rows"),
        (frame({}, '{"batch_size": 0}'), "batch_size"),
        (b"\x05\x00\x00\x00\x00\x00\x00\x00{}junk", "body"),
    ):
        resp = client.post(url, data=body, headers=frame_headers)
        assert resp.status_code == 400 and resp.content_type == "application/json", field
        assert field in resp.json["message"], (field, resp.json)
    # Only routes that take frames do; others still ask for JSON.
    other = client.post(f"/api/v1/jobs/{job_id}/segments", data=bad_dtype, headers=frame_headers)
    assert other.status_code == 415
    assert slots.size == 2 and buffer.table.priority[slots[1]] - buffer.table.priority[
        slots[0]
    ] == pytest.approx(2.0)  # nothing a refused frame carried was applied


def test_a_jobs_checkpoints_and_videos_are_served_and_nothing_else_of_its_folder(client, core):
    job_id = submit(client)
    core.store.write_bytes(core.store.checkpoint_path(job_id, 500, 1), b"checkpoint")
    core.store.write_bytes(f"{job_id}/videos/eval-00000003.mp4", b"mp4 bytes")
    listed = get(client, f"/api/v1/jobs/{job_id}/checkpoints")
    assert listed.status_code == 200
    assert listed.json == {"names": ["learner-e00000001-0000000500.safetensors"]}
    got = get(client, f"/api/v1/jobs/{job_id}/checkpoints/{listed.json['names'][0]}")
    assert got.status_code == 200 and got.data == b"checkpoint"
    video = get(client, f"/api/v1/jobs/{job_id}/videos/eval-00000003.mp4")
    assert video.status_code == 200 and video.mimetype == "video/mp4"
    assert video.data == b"mp4 bytes"
    for path in (
        f"/api/v1/jobs/{job_id}/checkpoints/job.json",
        f"/api/v1/jobs/{job_id}/checkpoints/..%2Fjob.json",
        f"/api/v1/jobs/{job_id}/videos/eval-00000004.mp4",
        f"/api/v1/jobs/{job_id}/videos/job.json",
        "/api/v1/jobs/job-nope/checkpoints",
    ):
        assert get(client, path).status_code == 404, path
