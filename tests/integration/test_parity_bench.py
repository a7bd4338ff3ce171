"""bench/parity.py on a tiny budget: both sides run the same seeded example, each
side's evaluations land in one `drover report`, and the bench's table has a row a
side with the learner's busy fraction on drover's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.processes, pytest.mark.smoke]

pytest.importorskip("mujoco")
pytest.importorskip("stable_baselines3")

ROOT = Path(__file__).resolve().parents[2]


def run_row(out: Path, row: str, name: str, *options: str, timeout_s: float) -> None:
    """bench/parity.py on one row, one seed, its runs in `out`; both sides' runs of its
    example (`name`, its exp_name) must land in one report, every run evaluated."""
    command = [sys.executable, str(ROOT / "bench" / "parity.py"), "--rows", row, "--seeds", "1"]
    command += [*options, "--out", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = (out / row / "report" / "report.md").read_text()
    assert f"| {name} | 1 | 1/1 |" in report, report
    assert f"| {name} (stable-baselines3) | 1 | 1/1 |" in report, report


def side_job(out: Path, row: str, side: str) -> dict:
    """The job record of the row's one run on `side`."""
    runs = "*/job-*" if side == "drover" else "*"
    (record,) = (out / row / side).glob(f"{runs}/coordinator/record.json")
    return json.loads(record.read_text())["job"]


def test_parity_bench_runs_both_sides_into_one_report(tmp_path: Path) -> None:
    out, figures = tmp_path / "parity", tmp_path / "figures.json"
    run_row(
        out,
        "sac-hopper",
        "hopper_sac",
        *("--budget", "1200", "--learning-starts", "400", "--eval-every-steps", "300"),
        *("--json", str(figures)),
        timeout_s=240,
    )
    # The same example on both sides: the SB3 side's record holds drover's resolved config.
    job = side_job(out, "sac-hopper", "stable-baselines3")
    assert job["config"]["policy"]["learn"]["batch_size"] == 256
    assert job["config"]["policy"]["collect"]["random_collect_size"] == 400
    # Its evaluations: one interval after training began, then every 300 env steps.
    assert [e["env_steps"] for e in job["evals"]] == [700, 1000, 1200]

    # drover's side evaluated the policy its job ended with (`final_eval`), at the budget.
    drover_job = side_job(out, "sac-hopper", "drover")
    assert drover_job["evals"][-1]["env_steps"] >= 1200, drover_job["evals"]
    assert drover_job["evals"][-1]["policy_version"] == drover_job["policy"]["version"]

    table = (out / "parity.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith(("| drover", "| stable"))]
    assert len(rows) == 2, table
    header = next(line for line in table.splitlines() if line.startswith("| side"))
    names, cells = header.strip("| ").split(" | "), rows[0].strip("| ").split(" | ")
    drover = dict(zip(names, cells, strict=True))
    busy = float(drover["learner busy"].split()[0])
    assert 0.0 < busy <= 1.0, rows[0]  # the learner's busy fraction, read from its scalars
    result = json.loads(figures.read_text())["figures"]["sac-hopper"]
    assert result["drover"]["final_iqm"] is not None
    assert result["stable-baselines3"]["final_iqm"] is not None
    assert result["wall_ratio"] > 0
    # Both sides evaluated at 1,000 env steps, the last before drover's budget ran out.
    assert result["common_steps"] >= 1000 and result["common_iqm_ratio"] > 0


def test_parity_bench_runs_ppo_with_normalization_on_both_sides(tmp_path: Path) -> None:
    """The PPO row: drover's sync rounds against SB3's PPO under VecNormalize, one
    report; SB3 evaluates on raw rewards with the training observation statistics."""
    out = tmp_path / "parity"
    run_row(
        out,
        "ppo-hopper",
        "hopper_ppo",
        "--budget",
        "2048",
        "--eval-every-steps",
        "1024",
        timeout_s=300,
    )
    job = side_job(out, "ppo-hopper", "stable-baselines3")
    assert [e["env_steps"] for e in job["evals"]] == [1024, 2048]
    # 4 rollouts of 512 env steps, each 5 epochs of 16 minibatches of 32.
    assert job["train_iters"] == 4 * 5 * 16
    drover_job = side_job(out, "ppo-hopper", "drover")
    assert drover_job["phase"] == "succeeded", drover_job.get("reason")
    assert drover_job["evals"][-1]["env_steps"] >= 2048, drover_job["evals"]
