"""Requests to a coordinator app in this process (Flask's test client): its token, a
small job, and the calls the service tests make. The `core` and `client` fixtures
(tests/conftest.py) make the coordinator and its app."""

from __future__ import annotations

import numpy as np

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: A small CartPole DQN job: a 100-item buffer, sampled from 20 items, evaluated
#: every 10 train iterations, succeeded at a mean return of 150.
CONFIG = {
    "env": {"env_id": "CartPole-v1", "stop_value": 150, "n_evaluator_episode": 2},
    "policy": {
        "other": {"replay_buffer": {"min_size_to_sample": 20, "replay_buffer_size": 100}},
        "eval": {"evaluator": {"eval_freq": 10}},
    },
}
#: The secret a worker registers with (the coordinator calls it with this).
SLAVE_TOKEN = "s" * 32


def post(client, path, body=None, **kw):
    return client.post(path, json=body, headers=AUTH, **kw)


def get(client, path, **kw):
    return client.get(path, headers=AUTH, **kw)


def register(client, role, url):
    """A worker's registration, with the secret the coordinator would call it with."""
    body = {"role": role, "url": url, "slave_token": SLAVE_TOKEN}
    return post(client, "/api/v1/workers", body)


def register_worker(client, role, url, resources):
    """A worker registered with `resources` (devices, ranks); its worker id."""
    body = {"role": role, "url": url, "slave_token": SLAVE_TOKEN, "resources": resources}
    resp = post(client, "/api/v1/workers", body)
    assert resp.status_code == 201, resp.json
    return resp.json["worker_id"]


def submit(client, config=CONFIG):
    resp = post(client, "/api/v1/jobs", {"config": config, "name": "t"})
    assert resp.status_code == 201, resp.json
    return resp.json["job_id"]


def reason(client, job_id):
    return get(client, f"/api/v1/jobs/{job_id}").json["reason"]


def planned(core):
    """(worker id, task kind) of every assignment of the next pass."""
    return sorted((d.worker_id, d.task.kind) for d in core.plan() if d.task)


def write_segment(core, job_id, seq, rows=10, worker="w1", *, header=False):
    """A CartPole DQN segment of `rows` rows on disk; the reference to insert it by
    (`header`: also in the file's header, as a collector writes it)."""
    path = core.store.segment_path(job_id, worker, seq)
    ref = {"path": path, "rows": rows, "env_steps": rows, "policy_version": 0}
    core.store.write_segment(
        path,
        {
            "obs": np.zeros((rows, 4), np.float32),
            "action": np.zeros(rows, np.int64),
            "reward": np.ones(rows, np.float32),
            "next_obs": np.zeros((rows, 4), np.float32),
            "done": np.zeros(rows, np.float32),
            "discount": np.ones(rows, np.float32),
        },
        header=ref if header else None,
    )
    return ref


def insert_segments(client, core, job_id, count):
    """`count` segments inserted, and counted by the coordinator (their buffer
    process's report read at once)."""
    from tests.buffer_hosts import read_reports  # it imports this module's token

    for seq in range(count):
        resp = post(
            client,
            f"/api/v1/jobs/{job_id}/segments",
            {"segments": [write_segment(core, job_id, seq)]},
        )
        assert resp.status_code == 200, resp.json
    read_reports(core)
