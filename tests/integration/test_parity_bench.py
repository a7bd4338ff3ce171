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


def test_parity_bench_runs_both_sides_into_one_report(tmp_path: Path) -> None:
    out, figures = tmp_path / "parity", tmp_path / "figures.json"
    command = [sys.executable, str(ROOT / "bench" / "parity.py"), "--rows", "sac-hopper"]
    command += ["--seeds", "1", "--budget", "1200", "--learning-starts", "400"]
    command += ["--eval-every-steps", "300", "--out", str(out), "--json", str(figures)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    # One report of both sides: a config each, every run evaluated.
    report = (out / "sac-hopper" / "report" / "report.md").read_text()
    assert "| hopper_sac | 1 | 1/1 |" in report, report
    assert "| hopper_sac (stable-baselines3) | 1 | 1/1 |" in report, report
    # The same example on both sides: the SB3 side's record holds drover's resolved config.
    (sb3_record,) = (out / "sac-hopper" / "stable-baselines3").glob("*/coordinator/record.json")
    job = json.loads(sb3_record.read_text())["job"]
    assert job["config"]["policy"]["learn"]["batch_size"] == 256
    assert job["config"]["policy"]["collect"]["random_collect_size"] == 400
    # Its evaluations: one interval after training began, then every 300 env steps.
    assert [e["env_steps"] for e in job["evals"]] == [700, 1000, 1200]

    # drover's side evaluated the policy its job ended with (`final_eval`), at the budget.
    (drover_record,) = (out / "sac-hopper" / "drover").glob("*/job-*/coordinator/record.json")
    drover_job = json.loads(drover_record.read_text())["job"]
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
    command = [sys.executable, str(ROOT / "bench" / "parity.py"), "--rows", "ppo-hopper"]
    command += ["--seeds", "1", "--budget", "2048", "--eval-every-steps", "1024"]
    command += ["--out", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = (out / "ppo-hopper" / "report" / "report.md").read_text()
    assert "| hopper_ppo | 1 | 1/1 |" in report, report
    assert "| hopper_ppo (stable-baselines3) | 1 | 1/1 |" in report, report
    (sb3_record,) = (out / "ppo-hopper" / "stable-baselines3").glob("*/coordinator/record.json")
    job = json.loads(sb3_record.read_text())["job"]
    assert [e["env_steps"] for e in job["evals"]] == [1024, 2048]
    # 4 rollouts of 512 env steps, each 5 epochs of 16 minibatches of 32.
    assert job["train_iters"] == 4 * 5 * 16
    (drover_record,) = (out / "ppo-hopper" / "drover").glob("*/job-*/coordinator/record.json")
    drover_job = json.loads(drover_record.read_text())["job"]
    assert drover_job["phase"] == "succeeded", drover_job.get("reason")
    assert drover_job["evals"][-1]["env_steps"] >= 2048, drover_job["evals"]
