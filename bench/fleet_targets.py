"""The data plane's targets from one run: each figure of the fleet bench that a target
is set for, before (another checkout's coordinator) and now, in turn, on this machine.

    python bench/fleet_targets.py --before DIR [--seconds 10]

Rows, each a fresh coordinator (bench/fleet.py's `run_row`, every process that serves
the data plane counted):

- inserts: 64 collectors inserting alone, 4 jobs: CPU per 1,000 inserted transitions;
- rounds: 4 learners in closed loops, 4 collectors at 2 segments/s: CPU per learner
  round (8 x 64 drawn, priorities sent back), all the data plane did over the rounds;
- fleet: 64 collectors at 20 segments/s and 4 learners: rates, p99s, errors, busy;
- 256: 256 collectors and 4 learners: errors and p99s;
- shards: one job, 64 collectors and its learner, `replay_buffer.shards` 1 then 2
  (now only: the coordinator before had no shards).

`--before DIR` is a checkout of the coordinator to compare with (a `git worktree` of
an older commit); its learners speak JSON when it predates the binary frames
(`--before-wire json`). Targets are those of the data-plane issue; where a figure is
set as a ratio on a slower machine, the ratio is printed beside it.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import fleet  # noqa: E402
from bench.results import write_figures  # noqa: E402


@dataclass(frozen=True)
class Row:
    name: str
    collectors: int
    learners: int
    jobs: int = 4
    insert_rate: float = 20.0
    shards: int = 1


ROWS = [
    Row("inserts", 64, 0),
    Row("rounds", 4, 4, insert_rate=2.0),
    Row("fleet", 64, 4),
    Row("256", 256, 4),
]
SHARD_ROWS = [Row("shards 1", 64, 1, jobs=1), Row("shards 2", 64, 1, jobs=1, shards=2)]


def run(row: Row, args: argparse.Namespace, *, before: bool) -> dict[str, Any]:
    argv = [
        f"--collectors={row.collectors}",
        f"--learners={row.learners}",
        f"--jobs={row.jobs}",
        f"--insert-rate={row.insert_rate}",
        f"--seconds={args.seconds}",
        f"--shards={row.shards}",
        f"--wire={args.before_wire if before else 'arrays'}",
        "--no-profile",
    ]
    if before:
        argv.append(f"--coordinator-from={args.before}")
    result = fleet.run_row(fleet.parse_args(argv), row.collectors)
    print(
        f"{row.name} ({'before' if before else 'now'}): "
        f"{result['transitions_per_s']:,.0f} transitions/s, "
        f"{result['samples_per_s']:,.0f} rounds/s, data plane at "
        f"{result['data_plane_cpu_share']:.0%} of a core",
        flush=True,
    )
    return result


def busy(result: dict[str, Any]) -> int:
    return sum(n for kind, n in result["back_pressure"].items() if "busy" in kind)


def errors(result: dict[str, Any]) -> int:
    return sum(result["errors"].values())


def p99(result: dict[str, Any], side: str) -> float:
    latency = result[f"{side}_latency_ms"]
    return latency["p99"] if latency else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of the coordinator before")
    parser.add_argument("--before-wire", choices=("arrays", "json"), default="json")
    parser.add_argument("--seconds", type=float, default=10.0, help="the timed window a row")
    parser.add_argument(
        "--rows",
        default=",".join(r.name for r in ROWS) + ",shards",
        help="which rows, comma-separated (default: all)",
    )
    parser.add_argument("--json", type=Path, help="also write each row's figures here")
    args = parser.parse_args(argv)
    names = set(args.rows.split(","))
    from rich.console import Console
    from rich.table import Table

    from bench.learner_scaling import cpu_line

    console = Console(width=200)
    console.print(cpu_line())
    results: dict[tuple[str, bool], dict[str, Any]] = {}
    for row in ROWS:
        if row.name not in names:
            continue
        for before in (True, False) if args.before else (False,):
            results[row.name, before] = run(row, args, before=before)
    if "shards" in names:
        for row in SHARD_ROWS:
            results[row.name, False] = run(row, args, before=False)
    figures: dict[str, dict[str, Any]] = {}
    for (name, before), result in results.items():
        figures.setdefault(name, {})["before" if before else "now"] = {
            "transitions_per_s": result["transitions_per_s"],
            "rounds_per_s": result["samples_per_s"],
            "cpu_ms_per_1k_transitions": result["data_plane_cpu_ms_per_1k"],
            "cpu_ms_per_round": result["data_plane_cpu_ms_per_round"],
            "insert_p99_ms": p99(result, "insert"),
            "sample_p99_ms": p99(result, "sample"),
            "errors": errors(result),
            "busy": busy(result),
        }
    write_figures(args.json, "fleet_targets", figures)

    def figure(name: str, before: bool, pick: Any) -> float | None:
        result = results.get((name, before))
        return None if result is None else pick(result)

    table = Table(title=f"Data plane targets, one run, {args.seconds:g} s a row")
    for column in ("figure", "target", "before", "now", "now / before", "met"):
        table.add_column(column, justify="right" if column != "figure" else "left")

    def add(label: str, target: str, name: str, pick: Any, ok: Any, fmt: str = ",.0f") -> None:
        if (name, False) not in results:
            return
        then, now = figure(name, True, pick), figure(name, False, pick)
        ratio = f"{now / then:.2f}x" if then and now is not None else "-"
        met = ok(now, then)
        table.add_row(
            label,
            target,
            "-" if then is None else format(then, fmt),
            format(now, fmt),
            ratio,
            "yes" if met else "NO",
        )

    def per_round(result: dict[str, Any]) -> float:
        return result["data_plane_cpu_ms_per_round"] or float("nan")

    add(
        "CPU per 1,000 inserted transitions (ms)",
        "<= 2, >= 5x less",
        "inserts",
        lambda r: r["data_plane_cpu_ms_per_1k"],
        lambda now, then: now <= 2.0 and (then is None or then / now >= 5),
        ".1f",
    )
    add(
        "CPU per learner round (ms)",
        "<= 0.3, >= 8x less",
        "rounds",
        per_round,
        lambda now, then: now <= 0.3 and (then is None or then / now >= 8),
        ".2f",
    )
    add(
        "64 + 4: transitions/s",
        ">= 75,000 (slower box: >= 5x)",
        "fleet",
        lambda r: r["transitions_per_s"],
        lambda now, then: now >= 75_000 or (then is not None and now / then >= 5),
    )
    add(
        "64 + 4: learner rounds/s",
        ">= 1,000 (slower box: >= 8x)",
        "fleet",
        lambda r: r["samples_per_s"],
        lambda now, then: now >= 1_000 or (then is not None and now / then >= 8),
    )
    for prefix, name, bound_ms in (("64 + 4", "fleet", 50), ("256 + 4", "256", 100)):
        for side in ("insert", "sample"):
            add(
                f"{prefix}: {side} p99 (ms)",
                f"< {bound_ms}",
                name,
                lambda r, side=side: p99(r, side),
                lambda now, then, bound_ms=bound_ms: now < bound_ms,
            )
        add(f"{prefix}: errors", "0", name, errors, lambda now, then: now == 0)
    add("64 + 4: busy answers", "0", "fleet", busy, lambda now, then: now == 0)
    if "shards" in names:
        one, two = results["shards 1", False], results["shards 2", False]
        gain = two["transitions_per_s"] / max(one["transitions_per_s"], 1.0)
        table.add_row(
            "shards 1 -> 2: transitions/s (one job, 64 + 1)",
            ">= 1.8x",
            f"{one['transitions_per_s']:,.0f} (1 shard)",
            f"{two['transitions_per_s']:,.0f} (2 shards)",
            f"{gain:.2f}x",
            "yes" if gain >= 1.8 else "NO",
        )
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
