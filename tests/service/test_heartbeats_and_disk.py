"""Heartbeats never wait on the disk: a shared volume that hangs in a write holds up
the write's own thread, not a worker's heartbeats nor the coordinator's answers to
them, so no lease expires because a disk was slow (the whole job on a slow volume:
tests/integration/test_slow_volume.py)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from common.config import deep_merge
from common.messages import CollectSpec, TaskAssignment
from common.storage import SharedStore
from services.coordinator.app import create_app
from services.coordinator.core import CoordinatorLimits
from services.coordinator.settings import CoordinatorSettings
from services.slave.core import Slave, TaskContext
from tests.buffer_hosts import make_coordinator
from tests.coordinator_app import CONFIG, TOKEN, register, submit
from tests.fakes import FakeCoordinator
from tests.helpers import wait_until

#: No goal, a budget of 5 train iterations.
BUDGET_OF_5_ITERS = {"env": {"stop_value": None}, "system": {"max_train_iter": 5}}
#: How long a heartbeat may take to be sent or answered here, where nothing else is
#: slow: far more than it takes, far less than the hung write.
BEAT_DEADLINE_S = 5.0


class HangingStore(SharedStore):
    """A shared store whose writes, once `hang` is set, wait until `unhang` is set, as
    on a volume whose server stopped answering."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.hang = threading.Event()
        self.unhang = threading.Event()
        #: Set when a write has started waiting.
        self.hung = threading.Event()

    def write_bytes(self, rel: str, data: bytes) -> Path:
        if self.hang.is_set():
            self.hung.set()
            assert self.unhang.wait(60), "the test never let the write go"
        return super().write_bytes(rel, data)


def in_thread(call: Any) -> tuple[threading.Thread, list[Any]]:
    """`call()` started in a daemon thread; what it returned lands in the list."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    return thread, out


# --- the coordinator answers ----------------------------------------------------------


def test_a_heartbeat_that_ends_a_job_is_answered_while_the_end_waits_on_the_disk(tmp_path):
    store = HangingStore(tmp_path)
    core = make_coordinator(store, CoordinatorLimits(max_buffer_items=1000))
    app = create_app(CoordinatorSettings(shared_dir=tmp_path, token=TOKEN), core=core)
    client = app.test_client()
    # A job whose budget is 5 train iterations: the learner's report of 5 ends it.
    job_id = submit(client, deep_merge(CONFIG, BUDGET_OF_5_ITERS))
    register(client, "collector", "http://127.0.0.1:8101")
    learner = register(client, "learner", "http://127.0.0.1:8201").json
    tasks = {d.worker_id: d.task for d in core.plan() if d.task is not None}
    for task in tasks.values():
        core.dispatched(task.task_id)
    learn_task = tasks[learner["worker_id"]].task_id
    # From now on the volume does not answer: the job's end, which writes its record
    # and summary (fsync'd), waits.
    store.hang.set()
    beat = {"tasks": [{"task_id": learn_task, "state": "running", "progress": {"train_iter": 5}}]}
    thread, answers = in_thread(
        lambda: client.post(
            f"/api/v1/workers/{learner['worker_id']}/heartbeat",
            json=beat,
            headers={"Authorization": f"Bearer {learner['credential']}"},
        )
    )
    try:
        thread.join(BEAT_DEADLINE_S)
        assert answers, "the heartbeat's answer waited on the disk"
        assert answers[0].status_code == 200, answers[0].json
        # The scheduler's pass ends the job: its own thread waits on the disk.
        ending, _ = in_thread(core.plan)
        assert store.hung.wait(BEAT_DEADLINE_S), "the job's end wrote nothing"
    finally:
        store.unhang.set()
    ending.join(BEAT_DEADLINE_S)
    assert core.job_status(job_id).phase == "succeeded"


# --- a worker heartbeats ---------------------------------------------------------------


class WritingRunner:
    """Writes one file to the shared store, then returns."""

    kinds = frozenset({"collect"})

    def __init__(self, store: SharedStore) -> None:
        self.store = store

    def run(self, ctx: TaskContext) -> dict[str, Any]:
        self.store.write_bytes(f"{ctx.task.job_id}/segments/{ctx.task.task_id}.bin", b"rows")
        return {}


class CountingCoordinator(FakeCoordinator):
    """Counts heartbeats, and the tasks each reported."""

    def __init__(self) -> None:
        super().__init__()
        self.beats: list[list[str]] = []

    def heartbeat(self, worker_id: str, tasks: list) -> Any:
        self.beats.append([t.task_id for t in tasks])
        return super().heartbeat(worker_id, tasks)


def test_a_worker_whose_task_hangs_in_a_write_still_heartbeats(tmp_path):
    store, coordinator = HangingStore(tmp_path), CountingCoordinator()
    slave = Slave(
        role="collector",
        runner=WritingRunner(store),
        coordinator=coordinator,
        advertise_url="http://127.0.0.1:1",
        shared_root=tmp_path,
    )
    slave.start()  # heartbeats every 0.05 s (FakeCoordinator)
    try:
        wait_until(lambda: slave.worker_id is not None, what="registration")
        store.hang.set()
        spec = CollectSpec(seed=0, num_envs=1)
        slave.assign(TaskAssignment(task_id="collect-1", job_id="job-1", spec=spec))
        assert store.hung.wait(BEAT_DEADLINE_S), "the task wrote nothing"
        hung_at = len(coordinator.beats)
        # Beats go on, each reporting the task, while its write hangs.
        wait_until(
            lambda: len(coordinator.beats) >= hung_at + 5,
            BEAT_DEADLINE_S,
            "heartbeats while the task's write hangs",
        )
        assert all(beat == ["collect-1"] for beat in coordinator.beats[hung_at:])
        store.unhang.set()
        wait_until(lambda: coordinator.completed, BEAT_DEADLINE_S, "the task's completion")
    finally:
        store.unhang.set()
        slave.close(timeout_s=5)
