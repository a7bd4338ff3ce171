"""A job's throughput on a slow shared volume: the short DQN job of
tests/integration/test_slow_volume.py, once per latency added to every fsync and read
call of the shared root (a FUSE pass-through, tests/slow_volume.py; root and FUSE
needed), as env steps per second against the same volume without latency.

    python bench/slow_volume.py --latencies-ms 0 50 200 500
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.slow_volume import fuse_unusable, run_job, short_job, slow_volume  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latencies-ms", type=float, nargs="+", default=[0, 50, 200, 500])
    args = parser.parse_args()
    unusable = fuse_unusable()
    if unusable is not None:
        print(f"no FUSE here: {unusable}", file=sys.stderr)
        return 1
    table = Table(title="a DQN job on a slow shared volume (2 collectors, 1 learner)")
    # ratio: env steps/s over the first row's (the first latency given, 0 by default)
    for column in ("ms a call", "phase", "env steps", "env steps/s", "ratio", "lease expiries"):
        table.add_column(column)
    baseline = None
    for latency_ms in args.latencies_ms:
        with tempfile.TemporaryDirectory(prefix="drover-slow-volume-") as scratch:
            folder = Path(scratch)
            with slow_volume(folder / "volume", folder / "backing", latency_ms / 1000) as root:
                run = run_job(root / "run", short_job(), timeout_s=900)
        rate = run.env_steps_per_s
        baseline = rate if baseline is None else baseline
        table.add_row(
            f"{latency_ms:g}",
            run.status.phase,
            str(run.status.env_steps),
            f"{rate:.0f}",
            f"{rate / baseline:.2f}",
            f"{run.lease_expiries:g}",
        )
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
