"""Randomized fault rounds over many seeds (tests/chaos.py), as a table.

Each round starts a coordinator, 3 collectors and a learner on 127.0.0.1, submits a
DQN CartPole job, kills the coordinator right after the submission, injects random
faults into every role and the job's buffer process until the job ends (kill -9,
SIGTERM, SIGSTOP past the 3 s lease, coordinator and learner killed together; the
buffer process killed with SIGKILL or SIGTERM; the shared volume full for 3-8 s or
slow for 5 s: its root is a tmpfs served through a FUSE pass-through, which needs root
and libfuse2), and kills the coordinator again right after the end.

With `--stays-full N`, the last N rounds end on a volume that fills for good: the job
(its `storage_grace_s` 10 s) must fail naming the volume, not hang, and its end be kept.

    python bench/chaos.py --seeds 10 [--stays-full 2]
    python bench/chaos.py --seeds 10 --no-volume-faults   # a plain folder as the root
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

from tests.chaos import chaos_round, fault_volume  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--faults", type=int, default=8, help="random faults per round")
    parser.add_argument(
        "--no-volume-faults",
        dest="volume_faults",
        action="store_false",
        help="a plain folder as the shared root: no full or slow volume",
    )
    parser.add_argument(
        "--stays-full",
        type=int,
        default=0,
        metavar="N",
        help="the last N rounds end on a volume full past the job's grace",
    )
    args = parser.parse_args()
    if args.stays_full and not args.volume_faults:
        parser.error("--stays-full needs the volume faults")
    table = Table(title="drover under random faults")
    for column in (
        "seed",
        "faults",
        "restarts",
        "phase",
        "ended once",
        "inserts lost",
        "env steps lost",
        "500s",
        "stale accepted",
        "summary kept",
        "wall s",
    ):
        table.add_column(column, justify="right")
    results = []
    last = args.first_seed + args.seeds
    for seed in range(args.first_seed, last):
        with tempfile.TemporaryDirectory() as tmp:
            if args.volume_faults:
                with fault_volume(Path(tmp) / "volume") as volume:
                    result = chaos_round(
                        Path(tmp) / "run",
                        seed,
                        max_faults=args.faults,
                        volume=volume,
                        stays_full=seed >= last - args.stays_full,
                    )
            else:
                result = chaos_round(Path(tmp) / "run", seed, max_faults=args.faults)
        results.append(result)
        table.add_row(
            str(seed),
            str(len(result.faults)),
            str(result.restarts),
            result.phase + (" (volume full)" if result.stays_full else ""),
            str(result.successes),
            str(result.inserts_lost),
            str(result.env_steps_lost),
            str(result.server_errors),
            str(result.stale_accepted),
            "yes" if result.summary_unchanged else "NO",
            f"{result.wall_s:.0f}",
        )
        print(f"seed {seed}: {'; '.join(result.faults)}", file=sys.stderr)
        if result.full_to_end_s is not None:
            print(
                f"seed {seed}: {result.phase} {result.full_to_end_s:.1f} s after its volume "
                f"filled for good: {result.reason}",
                file=sys.stderr,
            )
    table.add_row(
        "all",
        str(sum(len(r.faults) for r in results)),
        str(sum(r.restarts for r in results)),
        f"{sum(r.as_expected for r in results)}/{len(results)} as expected",
        str(sum(r.successes for r in results)),
        str(sum(r.inserts_lost for r in results)),
        str(sum(r.env_steps_lost for r in results)),
        str(sum(r.server_errors for r in results)),
        str(sum(r.stale_accepted for r in results)),
        f"{sum(r.summary_unchanged for r in results)}/{len(results)}",
        f"{sum(r.wall_s for r in results):.0f}",
    )
    Console(width=160).print(table)
    return 0 if all(r.as_expected for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
