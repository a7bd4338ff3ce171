"""What pruning saves a `drover tune` study, and whether its best config beats the one
shipped, as tables.

The study is examples/tuning/cartpole_ppo.yaml (PPO on CartPole: learning rate,
entropy weight and n_sample; objective env steps to 475), run twice with the same
sampler seed: with its median pruner and with none. Each trial is a job; the env steps
of a study are every trial's, pruned ones up to where they were stopped. Then the
pruned study's best config and the shipped example (examples/cartpole_ppo.yaml) each
run on the same `--seeds` new seeds (a `drover sweep` each), and `drover report` puts
both side by side with 95% bootstrap intervals.

    python bench/tune_target.py                        # 24 trials, 2 at a time; 5 seeds
    python bench/tune_target.py --trials 8 --seeds 3   # smaller
"""

from __future__ import annotations

import argparse
import json
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

STUDY = ROOT / "examples" / "tuning" / "cartpole_ppo.yaml"
SHIPPED = ROOT / "examples" / "cartpole_ppo.yaml"
#: Seeds the re-runs use: none of them the tuning's (system.seed 0).
FIRST_NEW_SEED = 100


def drover(*args: str, timeout_s: float) -> None:
    subprocess.run([sys.executable, "-m", "drover", *args], cwd=ROOT, check=True, timeout=timeout_s)


def only_run(folder: Path) -> Path:
    (run,) = [p for p in folder.iterdir() if p.is_dir()]
    return run


def tune(folder: Path, pruner: str, trials: int, parallel: int) -> dict:
    """One study, and what it took: its env steps, its best value, its trials' states."""
    import optuna

    config = folder / f"tune_{pruner}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "base": str(STUDY),
                "exp_name": f"cartpole_ppo_tune_{pruner}",
                "tune": {"pruner": pruner, "n_trials": trials, "n_parallel": parallel},
            }
        )
    )
    runs = folder / f"runs_{pruner}"
    started = time.monotonic()
    drover("tune", str(config), "--runs-dir", str(runs), timeout_s=6 * 3600)
    run_dir = only_run(runs)
    # The coordinator ran the study, in its experiment's folder.
    experiment_id = json.loads((run_dir / "tune.json").read_text())["experiment_id"]
    study = optuna.load_study(
        study_name=experiment_id,
        storage=f"sqlite:///{run_dir / 'experiments' / experiment_id / 'study.db'}",
    )
    states = [t.state.name for t in study.trials]
    return {
        "pruner": pruner,
        "run_dir": run_dir,
        "env_steps": sum(int(t.user_attrs.get("env_steps", 0)) for t in study.trials),
        "best": study.best_value,
        "best_params": study.best_params,
        "complete": states.count("COMPLETE"),
        "pruned": states.count("PRUNED"),
        "wall_s": time.monotonic() - started,
    }


def rerun(folder: Path, base: Path, name: str, seeds: int) -> Path:
    """`base` on the new seeds, one job at a time; its run folder."""
    config = folder / f"{name}.yaml"
    new_seeds = list(range(FIRST_NEW_SEED, FIRST_NEW_SEED + seeds))
    config.write_text(
        yaml.safe_dump(
            {
                "base": str(base),
                "exp_name": name,
                # One budget for both, the shipped example's (the tuning's trials had less).
                "system": {"max_env_step": 500_000},
                "sweep": {"seeds": new_seeds, "parallel": 1},
            }
        )
    )
    runs = folder / f"runs_{name}"
    drover("sweep", str(config), "--runs-dir", str(runs), timeout_s=3 * 3600)
    return only_run(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=5, help="new seeds for each re-run")
    parser.add_argument("--keep", type=Path, help="keep the run folders here")
    args = parser.parse_args()
    console = Console(width=200)  # whole rows in a log file too
    with tempfile.TemporaryDirectory(prefix="drover-tune-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        studies = [tune(folder, p, args.trials, args.parallel) for p in ("median", "none")]
        table = Table(title=f"drover tune, {args.trials} trials, {args.parallel} at a time")
        for column in (
            "pruner",
            "trials complete / pruned",
            "env steps, all trials",
            "best: env steps to 475",
            "best params",
            "wall s",
        ):
            table.add_column(column)
        for s in studies:
            table.add_row(
                s["pruner"],
                f"{s['complete']} / {s['pruned']}",
                f"{s['env_steps']:,}",
                f"{s['best']:,.0f}",
                ", ".join(f"{k}={v:.4g}" for k, v in s["best_params"].items()),
                f"{s['wall_s']:.0f}",
            )
        console.print(table)
        saved = 1 - studies[0]["env_steps"] / studies[1]["env_steps"]
        console.print(
            f"pruning saved {saved:.0%} of the env steps; best trial "
            f"{studies[0]['best']:,.0f} (pruned) against {studies[1]['best']:,.0f} (not)"
        )
        best = rerun(folder, studies[0]["run_dir"] / "best.yaml", "tuned_best", args.seeds)
        shipped = rerun(folder, SHIPPED, "shipped_example", args.seeds)
        drover("report", str(best), str(shipped), "--out", str(folder / "report"), timeout_s=600)


if __name__ == "__main__":
    main()
