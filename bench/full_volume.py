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
    python bench/full_volume.py --stays-full --grace-s 30

With `--stays-full` the volume is filled right after `drover run` submits the job and
stays full: the job must fail at its `system.storage_grace_s` and `drover run` exit
non-zero naming the volume, with the coordinator's reserve of room for records
(`DROVER_RECORD_RESERVE_BYTES`) and without one (the end then shown as "not yet
recorded"): how long after the fill it exited, its code and the line saying how the
job ended.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
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


def stays_full(folder: Path, grace_s: float, reserve: bool) -> dict:
    """`drover run` of the job on a fresh tmpfs that fills right after the submission
    and stays full: seconds from the fill to its exit, its exit code, and the line
    that says how the job ended."""
    config = folder / "job.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(deep_merge(JOB, {"system": {"storage_grace_s": grace_s}})))
    env = {**os.environ, "COLUMNS": "200"}
    if not reserve:
        env["DROVER_RECORD_RESERVE_BYTES"] = "0"
    log = folder / "drover.log"
    with tmpfs(folder / "volume", "256m") as volume, log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "drover", "run", str(config), "--runs-dir", str(volume)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            wait_until(lambda: "submitted" in log.read_text(), 120, "the submission")
            fill(volume / "filler")
            full_at = time.monotonic()
            code = proc.wait(timeout=grace_s + 300)
            exited_s = time.monotonic() - full_at
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    said = next((line for line in reversed(lines) if " failed: " in line), lines[-1])
    return {"exited_s": exited_s, "code": code, "said": said.strip()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full-s", type=float, default=60.0, help="how long the volume is full")
    parser.add_argument(
        "--stays-full", action="store_true", help="the volume stays full (see above)"
    )
    parser.add_argument("--grace-s", type=float, default=30.0, help="system.storage_grace_s")
    args = parser.parse_args()
    if args.stays_full:
        table = Table(title=f"the default job, its volume full for good (grace {args.grace_s:g} s)")
        for column in ("record reserve", "drover run exited after", "exit code", "said"):
            table.add_column(column)
        ok = True
        with tempfile.TemporaryDirectory() as tmp:
            for reserve in (True, False):
                r = stays_full(Path(tmp) / f"reserve-{reserve}", args.grace_s, reserve)
                ok &= r["code"] != 0 and "volume" in r["said"]
                table.add_row(
                    "16 MiB" if reserve else "none",
                    f"{r['exited_s']:.0f} s",
                    str(r["code"]),
                    r["said"][:110],
                )
        Console(width=180).print(table)
        return 0 if ok else 1
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
