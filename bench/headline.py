"""The README's performance table, made by the benches themselves.

    python bench/headline.py run       # every headline bench, about 12 minutes
    python bench/headline.py render    # README.md's table from their last run
    make bench-headline                # both

`run` runs each headline bench with `--json` (each writes its figures and the machine
it ran on: bench/results.py) and keeps what they wrote, with the commit and the date,
in bench/results/headline.json. `render` writes the table between README.md's
headline markers from that file alone. tests/unit/test_headline.py fails when the
README's table is not the rendering of bench/results/headline.json, so a figure there
cannot drift from the run that made it; docs/benchmarks.md has each bench's section.

The fleet row compares with the coordinator that hosted every job's buffer in its own
interpreter (commit `FLEET_BEFORE`), checked out for the run in a git worktree.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "bench" / "results" / "headline.json"
START = "<!-- headline: made by `python bench/headline.py render`; edit bench/headline.py -->"
END = "<!-- headline end -->"
#: The coordinator before buffer processes: the fleet row's reference.
FLEET_BEFORE = "46d88ad"


@dataclass(frozen=True)
class Headline:
    """One bench of the table: its command (its `--json PATH` is added)."""

    name: str
    command: tuple[str, ...]


#: Benches too long for `run` (an hour or more): each writes its figures where the table
#: reads them (`make bench-parity`, `make bench-scaling` pass `--json` this path), and
#: the table gains their rows, with their own machine and commit, once they ran.
SEPARATE = {
    "parity": ROOT / "bench" / "results" / "parity.json",
    "scaling": ROOT / "bench" / "results" / "scaling.json",
}

HEADLINES = (
    Headline("collector", ("bench/collector.py", "--algos", "dqn")),
    Headline("learner_feed", ("bench/learner_feed.py", "--algos", "dqn")),
    Headline("whole_run", ("bench/whole_run.py", "--seeds", "5")),
    Headline("memory", ("bench/memory.py",)),
    Headline("fleet", ("bench/fleet_targets.py", "--rows", "fleet", "--before", "{before}")),
)


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


def run() -> dict[str, Any]:
    """Every headline bench, one after the other, with the figures each wrote."""
    chosen = HEADLINES
    benches: dict[str, Any] = {}
    machine = ""
    with tempfile.TemporaryDirectory(prefix="headline-") as tmp:
        before = Path(tmp) / "before"
        if any("{before}" in h.command for h in chosen):
            git("worktree", "add", "--detach", str(before), FLEET_BEFORE)
        try:
            for headline in chosen:
                out = Path(tmp) / f"{headline.name}.json"
                command = [part.format(before=before) for part in headline.command]
                print(f"== {' '.join(command)}", flush=True)
                subprocess.run([sys.executable, *command, "--json", str(out)], cwd=ROOT, check=True)
                record = json.loads(out.read_text())
                benches[headline.name] = record["figures"]
                machine = record["machine"]
        finally:
            if before.exists():
                git("worktree", "remove", "--force", str(before))
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return {
        "machine": f"{machine}, {gpu}",
        "commit": git("rev-parse", "--short", "HEAD"),
        "date": datetime.date.today().isoformat(),
        "benches": benches,
    }


def table(results: dict[str, Any]) -> str:
    """The README's table (Markdown) from `results`."""
    b = results["benches"]
    collector, feed = b["collector"]["DQN"], b["learner_feed"]["dqn"]
    whole, memory, fleet = b["whole_run"], b["memory"], b["fleet"]
    fleet_now, fleet_before = fleet["fleet"]["now"], fleet["fleet"]["before"]
    fleet_ratio = fleet_now["transitions_per_s"] / fleet_before["transitions_per_s"]
    rows = [
        (
            "`bench/collector.py`",
            "one DQN collector on CartPole-v1 (8 envs), its step data written and "
            "inserted, against the same envs and inference with nothing written",
            f"{collector['measured_steps_per_s']:,.0f} vs "
            f"{collector['reference_steps_per_s']:,.0f} env steps/s",
            f"**{collector['ratio']:.2f}**",
            ">= 0.8",
            verdicts(">= 0.8", collector["ratio"]),
        ),
        (
            "`bench/learner_feed.py`",
            "a DQN learner (8 batches of 64 a request) fed through its job's buffer "
            "process and the shared store, against the same batches in memory",
            f"{feed['fed_iters_per_s']:,.0f} vs {feed['in_memory_iters_per_s']:,.0f} iterations/s",
            f"**{feed['ratio']:.2f}**",
            ">= 0.9",
            verdicts(">= 0.9", feed["ratio"]),
        ),
        (
            "`bench/whole_run.py`",
            "`drover run examples/cartpole_dqn.yaml`, start to exit, against one "
            "stable-baselines3 DQN process to the same goal, medians of "
            f"{whole['seeds']} seeds",
            f"{whole['drover_s']:.2f} s vs {whole['sb3_s']:.2f} s",
            f"**{whole['ratio']:.2f}**",
            "<= 1.0",
            verdicts("<= 1.0", whole["ratio"]),
        ),
        (
            "`bench/memory.py`",
            "peak PSS of every process of that run, summed",
            f"{max(memory['peak_pss_mb']):,.0f} MB",
            "-",
            "<= 600 MB",
            verdicts("<= 600 MB", max(memory["peak_pss_mb"])),
        ),
        (
            "`bench/fleet_targets.py`",
            "64 simulated collectors and 4 learners on one coordinator, transitions "
            f"indexed a second, against the coordinator of {FLEET_BEFORE} (every job's "
            "buffer in its own interpreter)",
            f"{fleet_now['transitions_per_s']:,.0f} vs {fleet_before['transitions_per_s']:,.0f}",
            f"**{fleet_ratio:.1f}x**",
            ">= 5x",
            verdicts(">= 5x", fleet_ratio),
        ),
    ]
    footer = [
        f"One run of each, one after the other, on {results['machine']}, at commit "
        f"{results['commit']} ({results['date']})."
    ]
    for name, path in SEPARATE.items():
        if path.exists():
            record = json.loads(path.read_text())
            rows += SEPARATE_ROWS[name](record["figures"])
            # A bench whose rows ran apart (parity: an hour a row) stamps each row.
            stamps = sorted(
                {(f["commit"], f["date"]) for f in record["figures"].values() if "commit" in f}
            ) or [(record["commit"], record["date"])]
            at = ", ".join(f"{commit} ({date})" for commit, date in stamps)
            footer.append(
                f"`bench/{name}.py`: its own runs, on {record['machine']}, at commit {at}."
            )
    lines = [
        "| bench | what is compared | measured | ratio | target | met |",
        "|---|---|---|---|---|---|",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        " ".join(footer),
    ]
    return "\n".join(lines)


def parity_rows(figures: dict[str, Any]) -> list[tuple[str, ...]]:
    """A row per env of bench/parity.py: drover's IQM final return and wall time to the
    budget against stable-baselines3's, the same example and seeds on both sides."""
    rows = []
    for row in figures.values():
        drover, sb3 = row["drover"], row["stable-baselines3"]
        rows.append(
            (
                "`bench/parity.py`",
                f"{row['algo'].upper()} on {row['env_id']}, {row['budget']:,} env steps, "
                f"{row['seeds']} seeds a side: `drover run` ({row['collectors']} collectors) "
                "against stable-baselines3 with the same settings (RL Zoo's): IQM return "
                f"at the last env steps both evaluated ({_num(row['common_steps'])}); IQM "
                "final return; median wall time to the budget",
                f"{_num(drover['common_iqm'])} vs {_num(sb3['common_iqm'])}; "
                f"{_num(drover['final_iqm'])} vs {_num(sb3['final_iqm'])}; "
                f"{_num(drover['wall_s_median'])} s vs {_num(sb3['wall_s_median'])} s",
                f"**{_num(row['common_iqm_ratio'], 2)}**; **{_num(row['final_iqm_ratio'], 2)}**; "
                f"**{_num(row['wall_ratio'], 2)}**",
                ">= 0.9; >= 0.9; <= 0.9",
                verdicts(
                    ">= 0.9; >= 0.9; <= 0.9",
                    row["common_iqm_ratio"],
                    row["final_iqm_ratio"],
                    row["wall_ratio"],
                ),
            )
        )
    return rows


def scaling_rows(figures: dict[str, Any]) -> list[tuple[str, ...]]:
    """bench/scaling.py's rows: efficiency and speed-up at 16 collectors against 1."""
    return [
        (
            "`bench/scaling.py`",
            f"{algo.upper()} ({row['workflow']}) to CartPole's goal on an env whose step "
            f"takes {row['step_ms']:g} ms, {row['collectors']} collectors against 1: env "
            "steps/s efficiency; median wall time to the goal (speed-up); env steps to it",
            f"{_num(row['efficiency'], 2)}; {_num(row['wall_s'], 1)} s vs "
            f"{_num(row['wall_s_at_1'], 1)} s; {_num(row['env_steps'])} vs "
            f"{_num(row['env_steps_at_1'])}",
            f"**{_num(row['efficiency'], 2)}**; **{_num(row['speedup'], 1)}x**; "
            f"**{_num(row['env_steps_ratio'], 2)}**",
            # The targets are the async workflow's; the sync one is reported beside it.
            ">= 0.8; >= 6x; <= 1.5" if row["workflow"] == "async" else "-",
            verdicts(
                ">= 0.8; >= 6x; <= 1.5" if row["workflow"] == "async" else "-",
                row["efficiency"],
                row["speedup"],
                row["env_steps_ratio"],
            ),
        )
        for algo, row in figures.items()
    ]


def verdicts(targets: str, *values: float | None) -> str:
    """Whether each value meets its target (`targets` as the table shows them: ">= 0.9;
    <= 600 MB; ..."): "met", or "**missed**", so a miss is never left for the reader to
    find; "-" where there is no target."""
    if targets == "-":
        return "-"
    said = []
    for target, value in zip(targets.split("; "), values, strict=True):
        match = re.fullmatch(r"(>=|<=) ([\d.]+)\D*", target)
        if match is None:
            raise ValueError(f"a target the table cannot check: {target!r}")
        if value is None:
            said.append("not measured")
            continue
        bound = float(match[2])
        met = value >= bound if match[1] == ">=" else value <= bound
        said.append("met" if met else "**missed**")
    return "; ".join(said)


SEPARATE_ROWS = {"parity": parity_rows, "scaling": scaling_rows}


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def render(readme: str, results: dict[str, Any]) -> str:
    """`readme` with the text between its headline markers made from `results`."""
    head, start, rest = readme.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise ValueError(f"README.md has no headline markers ({START} ... {END})")
    return f"{head}{START}\n{table(results)}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("run", "render"))
    args = parser.parse_args(argv)
    if args.step == "run":
        results = run()
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
        print(f"wrote {RESULTS.relative_to(ROOT)}")
        return 0
    results = json.loads(RESULTS.read_text())
    README.write_text(render(README.read_text(), results))
    print(f"rewrote the table in {README.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
