"""Population-based training against the same population without it, at equal env
steps, as a table.

The population is examples/sweeps/cartpole_dqn_pbt.yaml's: 4 DQN members on CartPole,
their learning rates drawn from [1e-4, 1e-2], each trained to the same env-step
budget. One side runs it as it is (every 2 evaluations the worst member takes the
best one's checkpoint and a perturbed learning rate); the other without its `pbt:`
section (each member trains alone). Each side runs `--populations` times, population
i with draw_seed i (its learning rates) and system.seed i, the same on both sides. A
population's score is its best member's final evaluation return; the table gives each
side's median and IQM over its populations with 95% bootstrap intervals.

    python bench/pbt.py                          # 5 populations a side
    python bench/pbt.py --populations 2 --env-steps 10000
"""

from __future__ import annotations

import argparse
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

from drover import stats  # noqa: E402
from drover.report import experiments_of, read_configs  # noqa: E402

EXAMPLE = ROOT / "examples" / "sweeps" / "cartpole_dqn_pbt.yaml"


def population(folder: Path, side: str, index: int, env_steps: int) -> dict:
    """One population's run: its members' final returns and its population steps."""
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["base"] = str((EXAMPLE.parent / raw["base"]).resolve())
    raw["exp_name"] = f"{side}_{index}"
    raw["system"] = {**raw.get("system", {}), "max_env_step": env_steps}
    raw["sweep"] = {**raw["sweep"], "draw_seed": index, "seeds": [index]}
    if side == "alone":
        del raw["pbt"]
    config = folder / f"{side}_{index}.yaml"
    config.write_text(yaml.safe_dump(raw))
    runs = folder / f"runs_{side}_{index}"
    members = int(raw["sweep"].get("samples", 1))
    started = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "drover",
            "sweep",
            str(config),
            "--runs-dir",
            str(runs),
            "--learners",
            str(members),
            "--collectors",
            str(members),
        ],
        cwd=ROOT,
        check=True,
        timeout=3600,
        stderr=subprocess.DEVNULL,
    )
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    experiments = experiments_of(run_dir, None)
    runs = [r for c in read_configs(run_dir, None, experiments) for r in c.runs]
    finals = [r.final_return for r in runs]
    steps = sum(len(e.lineage) for e in experiments)
    last = [float(r.x[-1]) for r in runs if r.x.size]
    return {
        "finals": finals,
        "steps": steps,
        "wall_s": time.monotonic() - started,
        "last_eval_env_steps": sum(last) / len(last),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--populations", type=int, default=5, help="populations a side")
    parser.add_argument("--env-steps", type=int, default=30_000, help="each member's budget")
    parser.add_argument("--keep", type=Path, help="keep the run folders here")
    args = parser.parse_args()
    console = Console(width=200)  # whole rows in a log file too
    with tempfile.TemporaryDirectory(prefix="drover-pbt-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        results: dict[str, list[dict]] = {"pbt": [], "alone": []}
        for index in range(args.populations):
            for side in results:  # the sides take turns: a slower stretch hits both
                result = population(folder, side, index, args.env_steps)
                results[side].append(result)
                console.print(
                    f"{side} {index}: best {max(result['finals']):.1f}, finals "
                    f"{[round(f, 1) for f in result['finals']]}, {result['steps']} population "
                    f"steps, {result['wall_s']:.0f} s"
                )
        table = Table(
            title=f"best member's final return, {args.populations} populations of 4 a side, "
            f"{args.env_steps:,} env steps a member"
        )
        for column in (
            "side",
            "populations",
            "best, median",
            "best, IQM",
            "members' mean, IQM",
            "population steps",
            "env steps at the last eval, mean",
            "wall s, median",
        ):
            table.add_column(column)
        for side, runs in results.items():
            best = [max(r["finals"]) for r in runs]
            mean = [sum(r["finals"]) / len(r["finals"]) for r in runs]
            table.add_row(
                "population-based training" if side == "pbt" else "each member alone",
                str(len(runs)),
                stats.estimate(best, stats.median).text(1),
                stats.estimate(best, stats.iqm).text(1),
                stats.estimate(mean, stats.iqm).text(1),
                str(sum(r["steps"] for r in runs)),
                f"{sum(r['last_eval_env_steps'] for r in runs) / len(runs):,.0f}",
                f"{sorted(r['wall_s'] for r in runs)[len(runs) // 2]:.0f}",
            )
        console.print(table)


if __name__ == "__main__":
    main()
