"""A coordinator's memory as jobs and tasks come and go, in a process of its own (so its
RSS is the coordinator's): jobs are submitted, get a task on each registered worker,
and are stopped; then a fresh coordinator restores them all. Their buffers are served
in threads of this process (tests/buffer_hosts.py), 1,000 items each, so that what
grows is the coordinator's own (it holds no buffer: each job's buffer process does).

    python -m tests.coordinator_memory --shared DIR --jobs 1000 --workers 101
    python -m tests.coordinator_memory --shared DIR --restore

Prints one JSON line: RSS in MiB after warm-up and at the end, with the tasks
created and what the coordinator still holds; with --restore, a new coordinator's RSS
before and after it restores what it finds under DIR.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

from common.messages import Heartbeat, JobSubmit, WorkerRegistration
from common.storage import SharedStore
from services.coordinator.__main__ import give_freed_buffers_back
from services.coordinator.core import Coordinator, CoordinatorLimits
from tests.buffer_hosts import make_coordinator

CONFIG = {
    "env": {"env_id": "CartPole-v1", "stop_value": 195},
    # Small: the buffers are the buffer processes', not the coordinator's memory.
    "policy": {"other": {"replay_buffer": {"replay_buffer_size": 1_000}}},
    "system": {"collector_num": 256},
}


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def run_jobs(core: Coordinator, count: int, workers: list[str]) -> int:
    """Submit, assign and stop `count` jobs; returns the tasks created."""
    created = 0
    for _ in range(count):
        for worker_id in workers:  # the workers stay alive, as real ones would
            core.heartbeat(worker_id, Heartbeat(tasks=[]))
        job_id = core.submit_job(JobSubmit(config=CONFIG)).job_id
        for dispatch in core.plan():
            if dispatch.task is not None:
                core.dispatched(dispatch.task.task_id)
                created += 1
        core.stop_job(job_id)
    return created


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shared", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--warmup-jobs", type=int, default=50)
    parser.add_argument("--restore", action="store_true")
    args = parser.parse_args()
    give_freed_buffers_back()  # as the coordinator's own process does
    limits = CoordinatorLimits(max_ended_jobs=args.jobs + args.warmup_jobs)
    core = make_coordinator(SharedStore(args.shared), limits)
    if args.restore:
        fresh = rss_mib()
        restored = len(core.restore_jobs())
        gc.collect()
        report = {"rss_fresh_mib": fresh, "rss_restored_mib": rss_mib(), "restored": restored}
        print(json.dumps(report))
        return
    workers = [
        core.register_worker(
            WorkerRegistration(
                role="collector" if i else "learner", url=f"http://w{i}:1", slave_token="s" * 32
            )
        ).worker_id
        for i in range(args.workers)
    ]
    started = time.monotonic()
    tasks = run_jobs(core, args.warmup_jobs, workers)
    gc.collect()
    warm = rss_mib()
    tasks += run_jobs(core, args.jobs, workers)
    gc.collect()
    end = rss_mib()
    held = {
        "jobs": len(core.jobs),
        "tasks": len(core.tasks),
        "ended_tasks": len(core.state.ended_tasks),
    }
    core.close()
    report = {
        "rss_warm_mib": warm,
        "rss_end_mib": end,
        "tasks_created": tasks,
        "held": held,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
