"""A collector and a learner written from docs/worker-protocol.md alone, through a real
coordinator and buffer process: every body they send is one of the page's examples
with its values filled in, and every answer they get has the fields the page's example
of it has. No drover worker code is used (no slave framework, no clients): plain HTTP,
numpy and safetensors, as a worker in another language would have."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import yaml
from safetensors.numpy import save_file

from common.config import deep_merge
from drover.local import LocalCluster
from tests.helpers import EXAMPLES, wait_until

pytestmark = pytest.mark.processes

PAGE = Path(__file__).resolve().parents[2] / "docs" / "worker-protocol.md"
#: The page's examples by name: `<!-- example: NAME -->` above a JSON block.
EXAMPLE = {
    name: json.loads(body)
    for name, body in re.findall(
        r"<!-- example: ([\w-]+) -->\n```json\n(.*?)\n```", PAGE.read_text(), re.S
    )
}
JOB = deep_merge(
    yaml.safe_load((EXAMPLES / "cartpole_dqn.yaml").read_text()),
    {
        "env": {"stop_value": None},
        "policy": {"nstep": 1, "other": {"replay_buffer": {"min_size_to_sample": 64}}},
        "system": {"max_env_step": None},
    },
)
ROWS = 64


def test_the_page_has_every_example_the_worker_uses():
    assert set(EXAMPLE) >= {
        "register",
        "registered",
        "task",
        "heartbeat",
        "heartbeat-reply",
        "insert",
        "insert-reply",
        "evaluate-result",
        "sample",
        "sample-reply",
    }


class PageWorker:
    """A worker as the page describes it: its two routes on a small HTTP server, its
    registration, and a heartbeat thread listing the tasks it was given."""

    def __init__(self, cluster: LocalCluster, role: str) -> None:
        self.cluster = cluster
        self.tasks: dict[str, dict[str, Any]] = {}
        self.replies: list[dict[str, Any]] = []
        body = dict(EXAMPLE["register"])
        self.slave_token = body["slave_token"]
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        body |= {"role": role, "url": f"http://127.0.0.1:{self.server.server_address[1]}"}
        answer = requests.post(
            f"{cluster.coordinator_url}/api/v1/workers",
            json=body,
            headers={"Authorization": f"Bearer {cluster.registration_token}"},
            timeout=10,
        )
        assert answer.status_code == 201, answer.text
        registered = answer.json()
        assert set(registered) == set(EXAMPLE["registered"])
        self.worker_id, self.credential = registered["worker_id"], registered["credential"]
        self.interval_s = registered["heartbeat_interval_s"]
        self.stop = threading.Event()
        threading.Thread(target=self._beat, daemon=True).start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        worker = self

        class Routes(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _allowed(self) -> bool:
                if self.headers.get("Authorization") == f"Bearer {worker.slave_token}":
                    return True
                self._answer(401, {"code": "unauthorized", "message": "not my token"})
                return False

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                task = json.loads(self.rfile.read(length))
                if not self._allowed():
                    return
                if self.path == "/v1/tasks":
                    worker.tasks.setdefault(task["task_id"], task)
                    self._answer(202, {"task_id": task["task_id"]})
                else:  # a release: this worker has nothing in flight, it ends at once
                    task_id = self.path.split("/")[3]
                    worker.tasks.pop(task_id, None)
                    self._answer(202, {"task_id": task_id})

            def do_DELETE(self) -> None:
                if not self._allowed():
                    return
                task_id = self.path.rsplit("/", 1)[1]
                found = worker.tasks.pop(task_id, None)
                self._answer(202 if found else 404, {"task_id": task_id})

        return Routes

    def _beat(self) -> None:
        url = f"{self.cluster.coordinator_url}/api/v1/workers/{self.worker_id}/heartbeat"
        while not self.stop.wait(self.interval_s / 2):
            example = EXAMPLE["heartbeat"]["tasks"][0]
            body = {
                "tasks": [
                    {**example, "task_id": task_id, "progress": {}} for task_id in list(self.tasks)
                ]
            }
            reply = self.call("POST", url, body, self.credential).json()
            assert set(reply) == set(EXAMPLE["heartbeat-reply"]), reply
            self.replies.append(reply)
            for task_id in reply["cancel"]:
                self.tasks.pop(task_id, None)
            for task_id, fresh in reply["credentials"].items():
                if task_id in self.tasks:
                    self.tasks[task_id]["spec"]["data"]["credential"] = fresh

    @staticmethod
    def call(method: str, url: str, body: dict[str, Any], secret: str) -> requests.Response:
        answer = requests.request(
            method, url, json=body, headers={"Authorization": f"Bearer {secret}"}, timeout=15
        )
        assert answer.status_code < 300, (url, answer.status_code, answer.text)
        return answer

    def task(self, kind: str) -> dict[str, Any]:
        wait_until(
            lambda: any(t["spec"]["kind"] == kind for t in self.tasks.values()),
            60,
            f"a {kind} task for the page's worker",
        )
        (task,) = [t for t in self.tasks.values() if t["spec"]["kind"] == kind]
        assert set(task) == set(EXAMPLE["task"])
        return task

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()


def write_segment(root: Path, path: str, ref: dict[str, Any]) -> None:
    """A DQN transition segment as the page says: equal-length columns, the reference
    as JSON under the metadata key `drover`, a temporary name renamed into place."""
    rng = np.random.default_rng(0)
    columns = {
        "obs": rng.standard_normal((ROWS, 4)).astype(np.float32),
        "next_obs": rng.standard_normal((ROWS, 4)).astype(np.float32),
        "action": rng.integers(0, 2, ROWS).astype(np.int64),
        "reward": np.ones(ROWS, np.float32),
        "discount": np.full(ROWS, 0.99, np.float32),
        "done": np.zeros(ROWS, np.float32),
    }
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    save_file(columns, str(target) + ".tmp", metadata={"drover": json.dumps(ref)})
    Path(str(target) + ".tmp").rename(target)


@pytest.mark.timeout(180)
def test_a_worker_written_from_the_page_collects_and_a_learner_samples_what_it_wrote(tmp_path):
    with LocalCluster(tmp_path / "run", num_collectors=0, num_learners=0) as cluster:
        collector = PageWorker(cluster, "collector")
        job_id = cluster.client.submit_job(JOB).job_id
        task = collector.task("collect")
        assert task["job_id"] == job_id
        access = task["spec"]["data"]
        # A segment in the task's own folder, inserted with the task's data credential.
        folder = f"{job_id}/segments/{collector.worker_id}.{task['task_id']}"
        (example_ref,) = EXAMPLE["insert"]["segments"]
        ref = {
            **example_ref,
            "path": f"{folder}/00000000.safetensors",
            "rows": ROWS,
            "env_steps": ROWS,
        }
        write_segment(cluster.shared_dir, ref["path"], ref)
        insert = {**EXAMPLE["insert"], "segments": [ref], "task_id": task["task_id"]}
        url = f"{access['urls'][0]}/api/v1/jobs/{job_id}/segments"
        reply = collector.call("POST", url, insert, access["credential"]).json()
        assert set(reply) == set(EXAMPLE["insert-reply"])
        assert (reply["accepted"], reply["duplicates"]) == (1, 0)
        again = collector.call("POST", url, insert, access["credential"]).json()
        assert (again["accepted"], again["duplicates"]) == (0, 1)  # idempotent by path
        # Without its task id, a data call with a task credential is refused, naming it.
        unnamed = requests.post(
            url,
            json={k: v for k, v in insert.items() if k != "task_id"},
            headers={"Authorization": f"Bearer {access['credential']}"},
            timeout=10,
        )
        assert unnamed.status_code == 400 and "task_id" in unnamed.json()["message"]
        wait_until(lambda: cluster.client.job(job_id).env_steps >= ROWS, 30, "the env steps")

        learner = PageWorker(cluster, "learner")
        learn = learner.task("learn")
        access = learn["spec"]["data"]
        sample = {**EXAMPLE["sample"], "task_id": learn["task_id"]}
        url = f"{access['urls'][0]}/api/v1/jobs/{job_id}/samples"
        drawn = learner.call("POST", url, sample, access["credential"]).json()
        assert set(drawn) == set(EXAMPLE["sample-reply"])
        (batch,) = drawn["batches"]
        assert set(batch) == set(EXAMPLE["sample-reply"]["batches"][0])
        assert len(batch["keys"]) == sample["batch_size"]
        assert {s["path"] for s in batch["segments"]} == {ref["path"]}
        # Its priorities ride on the next request.
        sample |= {"priority_keys": batch["keys"], "priorities": [0.5] * len(batch["keys"])}
        learner.call("POST", url, sample, access["credential"])

        # The job's end reaches both: their tasks are cancelled.
        cluster.client.stop_job(job_id)
        deadline = time.monotonic() + 30
        while collector.tasks.get(task["task_id"]) or learner.tasks.get(learn["task_id"]):
            assert time.monotonic() < deadline, (collector.replies[-3:], learner.replies[-3:])
            time.sleep(0.2)
        collector.close()
        learner.close()
