"""A shared volume full for a while in the middle of the default job, against the same
job with room throughout, as a table.

The job is `make run`'s (examples/cartpole_dqn.yaml) without its goal, so that it
ends at its env-step budget whatever the wait cost (with its goal it could succeed
before the volume has room again), and with 1-step transitions, so that a segment's
rows are its env steps and acknowledged inserts must equal the counted env steps; its
shared root is a tmpfs (root only), and the services' logs are kept off it. Once the
job has trained, the volume is filled for `--full-s` seconds; then the filler goes and
the job must go on and succeed, every acknowledged insert counted.

    python bench/full_volume.py --full-s 60
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.config import deep_merge  # noqa: E402
from drover.local import LocalCluster  # noqa: E402
from tests.helpers import fill, tmpfs, wait_for_end, wait_until  # noqa: E402

JOB = deep_merge(
    yaml.safe_load((ROOT / "examples" / "cartpole_dqn.yaml").read_text()),
    {"env": {"stop_value": None}, "policy": {"nstep": 1}, "system": {"max_env_step": 15_000}},
)


def run(folder: Path, full_s: float) -> dict:
    """The job on a fresh tmpfs, full for `full_s` seconds once it has trained."""
    with (
        tmpfs(folder / "volume", "512m") as volume,
        LocalCluster(volume / "run", logs_at=folder / "logs") as cluster,
    ):
        cluster.wait_for_workers()
        started = time.monotonic()
        job_id = cluster.client.submit_job(JOB).job_id
        wait_until(lambda: cluster.client.job(job_id).train_iters > 0, 120, "training")
        shown_s = None
        if full_s > 0:
            filler = volume / "filler"
            fill(filler)
            full_at = time.monotonic()
            with contextlib.suppress(AssertionError):  # never shown: "-" below
                wait_until(
                    lambda: cluster.client.job(job_id).storage_full_s is not None,
                    full_s,
                    "the status to say so",
                )
                shown_s = time.monotonic() - full_at
            time.sleep(max(0.0, full_s - (time.monotonic() - full_at)))
            filler.unlink()
        status = wait_for_end(cluster, job_id, 900)
        inserts = cluster.client.buffer_stats(job_id)["inserts"]
    return {
        "phase": status.phase,
        "env_steps": status.env_steps,
        "inserts": inserts,
        "task_failures": status.task_failures,
        "wall_s": time.monotonic() - started,
        "shown_s": shown_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full-s", type=float, default=60.0, help="how long the volume is full")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for full_s in (0.0, args.full_s):
            rows.append((full_s, run(Path(tmp) / f"full-{full_s:g}", full_s)))
    table = Table(title="the default job (no goal, 15,000 env steps) with its volume full")
    for column in (
        "full for",
        "phase",
        "env steps",
        "inserts",
        "failed tasks",
        "shown after",
        "wall s",
        "wall vs room",
    ):
        table.add_column(column, justify="right")
    reference_s = rows[0][1]["wall_s"]
    for full_s, r in rows:
        table.add_row(
            f"{full_s:g} s",
            r["phase"],
            f"{r['env_steps']:,}",
            f"{r['inserts']:,}",
            str(r["task_failures"]),
            "-" if r["shown_s"] is None else f"{r['shown_s']:.1f} s",
            f"{r['wall_s']:.0f}",
            f"{r['wall_s'] / reference_s:.2f}x",
        )
    Console(width=140).print(table)
    ok = all(r["phase"] == "succeeded" and r["inserts"] == r["env_steps"] for _, r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
