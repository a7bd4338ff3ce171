"""What an experiment costs the coordinator: sweeps it must refuse, a large one it must
admit, and the experiment list, against a real coordinator process (with its buffer
processes, as deployed) on 127.0.0.1.

    python bench/experiments.py [--jobs 1000] [--experiments 100]

Rows, each one request timed by the caller, with the coordinator's RSS before and after:

- `samples: 10000000` and a 10^9-point grid (nine axes of ten values): refused, 400
  naming `sweep`, before anything is expanded;
- `--jobs` seeds of the CartPole DQN example, two running at once: admitted, its jobs
  queued (no buffer process for a queued one);
- the experiment list, once `--experiments` experiments exist (one page of them).

Targets (issue 59): refusals in < 50 ms with RSS within 10 MB; 1,000 jobs admitted in
< 5 s; the list of 100 experiments in < 100 ms.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learner_scaling import cpu_line  # noqa: E402
from drover.local import free_port  # noqa: E402

TOKEN = "bench-experiments-token"
#: Nine numeric keys of the DQN example: a grid over ten values each has 10^9 points.
GRID_KEYS = (
    "policy.learn.batch_size",
    "policy.learn.learning_rate",
    "policy.learn.target_update_freq",
    "policy.discount_factor",
    "policy.nstep",
    "policy.other.replay_buffer.replay_buffer_size",
    "policy.other.replay_buffer.min_size_to_sample",
    "env.collector_env_num",
    "env.evaluator_env_num",
)
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed(call) -> tuple[requests.Response, float]:
    started = time.perf_counter()
    response = call()
    return response, (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs of the admitted sweep")
    parser.add_argument("--experiments", type=int, default=100, help="experiments listed")
    args = parser.parse_args()
    base = yaml.safe_load((ROOT / "examples" / "cartpole_dqn.yaml").read_text())
    shared = Path(tempfile.mkdtemp(prefix="drover-bench-experiments-"))
    port = free_port()
    env = {
        **os.environ,
        "DROVER_TOKEN": TOKEN,
        "DROVER_PORT": str(port),
        "DROVER_SHARED_DIR": str(shared),
        "DROVER_MAX_EXPERIMENT_JOBS": str(max(1000, args.jobs)),
    }
    log = (shared / "coordinator.log").open("wb")
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "services.coordinator"],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/api/v1/experiments"
    session = requests.Session()
    rows: list[tuple[str, str, float, float, float]] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if session.get(f"http://127.0.0.1:{port}/healthz", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the coordinator did not start in 60 s")
            time.sleep(0.2)

        def submit(config: dict, name: str) -> tuple[requests.Response, float]:
            body = {"config": config, "name": name}
            return timed(lambda: session.post(url, json=body, headers=HEADERS, timeout=120))

        refusals = {
            "samples: 10,000,000": {
                **base,
                "sweep": {
                    "samples": 10_000_000,
                    "axes": {"policy.learn.learning_rate": {"uniform": [1e-4, 1e-2]}},
                },
            },
            "grid of 10^9 points": {
                **base,
                "sweep": {
                    # Keys the config has, each over ten values.
                    "axes": {key: [i + 1 for i in range(10)] for key in GRID_KEYS},
                },
            },
        }
        for name, config in refusals.items():
            before = rss_mib(coordinator.pid)
            answer, ms = submit(config, name)
            after = rss_mib(coordinator.pid)
            outcome = f"{answer.status_code}: {answer.json().get('message', '')[:60]}"
            rows.append((name, outcome, ms, before, after))
        before = rss_mib(coordinator.pid)
        answer, ms = submit({**base, "sweep": {"seeds": args.jobs, "parallel": 2}}, "large")
        after = rss_mib(coordinator.pid)
        jobs = len(answer.json().get("job_ids", []))
        rows.append(
            (
                f"{args.jobs:,} jobs admitted",
                f"{answer.status_code}: {jobs} jobs",
                ms,
                before,
                after,
            )
        )
        small = {**base, "sweep": {"seeds": 2, "parallel": 1}}
        for i in range(args.experiments - 1):
            submit(small, f"small-{i}")
        before = rss_mib(coordinator.pid)
        answer, ms = timed(lambda: session.get(url, headers=HEADERS, timeout=60))
        listed = len(answer.json().get("experiments", []))
        more = answer.json().get("next_page_token") is not None
        outcome = f"{answer.status_code}: {listed} shown" + (
            ", more on the next page" if more else ""
        )
        rows.append(
            (
                f"list of {args.experiments} experiments",
                outcome,
                ms,
                before,
                rss_mib(coordinator.pid),
            )
        )
    finally:
        coordinator.terminate()
        try:
            coordinator.wait(30)
        except subprocess.TimeoutExpired:
            coordinator.kill()
        log.close()
    table = Table(title=f"experiments against one coordinator ({cpu_line()})")
    for column in ("request", "answer", "ms", "RSS before, MiB", "RSS after, MiB"):
        table.add_column(column)
    for name, outcome, ms, before, after in rows:
        table.add_row(name, outcome, f"{ms:,.0f}", f"{before:,.1f}", f"{after:,.1f}")
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
