"""An experiment and a tuning through real services, from the command line: `drover
sweep` runs a sweep's jobs on a local cluster and `drover report` reads them back;
`drover tune` runs an Optuna study's trials as jobs and writes the best config."""

import json
import subprocess
import sys

import pytest
import yaml

from tests.helpers import EXAMPLE, ROOT

pytestmark = [pytest.mark.processes]

#: make run's DQN without a goal, ended by a small budget: a job of a few seconds.
SHORT = {
    "base": str(EXAMPLE),
    "env": {"stop_value": None, "n_evaluator_episode": 2},
    "policy": {"eval": {"evaluator": {"eval_freq": 50}}},
    "system": {"max_env_step": 2000},
}


def drover(*args: str, timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "drover", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@pytest.mark.timeout(400)
def test_a_sweep_runs_every_job_and_its_report_has_a_row_a_point(tmp_path):
    config = tmp_path / "sweep.yaml"
    axes = {"policy.learn.learning_rate": [0.001, 0.0023]}
    config.write_text(
        yaml.safe_dump(
            {**SHORT, "exp_name": "lr", "sweep": {"seeds": 2, "parallel": 2, "axes": axes}}
        )
    )
    runs = tmp_path / "runs"
    swept = drover("sweep", str(config), "--runs-dir", str(runs), timeout_s=300)
    assert swept.returncode == 0, swept.stderr[-3000:]
    assert "4 jobs (2 points x 2 seeds), 2 at a time" in swept.stderr
    assert "4 of 4 jobs succeeded" in swept.stderr
    (run_dir,) = runs.iterdir()
    reported = drover("report", str(run_dir), timeout_s=120)
    assert reported.returncode == 0, reported.stderr
    rows = [line for line in reported.stdout.splitlines() if line.startswith("| learning_rate=")]
    assert len(rows) == 2 and all(" | 2 | 2/2 | " in row for row in rows), reported.stdout
    assert (run_dir / "report" / "curves.png").is_file()


@pytest.mark.timeout(400)
def test_a_tune_runs_its_trials_as_jobs_and_writes_the_best_config(tmp_path):
    config = tmp_path / "tune.yaml"
    tune = {
        "n_trials": 3,
        "n_parallel": 1,
        "objective": "final_return",
        "pruner": "none",
        "params": {"policy.learn.learning_rate": {"log_uniform": [0.0005, 0.005]}},
    }
    config.write_text(yaml.safe_dump({**SHORT, "exp_name": "lr_tune", "tune": tune}))
    runs = tmp_path / "runs"
    tuned = drover("tune", str(config), "--runs-dir", str(runs), timeout_s=300)
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    assert "3 trials: 3 complete, 0 pruned, 0 failed" in tuned.stderr
    (run_dir,) = runs.iterdir()
    best = yaml.safe_load((run_dir / "best.yaml").read_text())
    assert 0.0005 <= best["policy"]["learn"]["learning_rate"] <= 0.005
    # The coordinator ran the study, in the experiment's folder.
    experiment_id = json.loads((run_dir / "tune.json").read_text())["experiment_id"]
    assert "tune" not in best and (run_dir / "experiments" / experiment_id / "study.db").is_file()
    assert (run_dir / "history.png").is_file()


@pytest.mark.timeout(400)
def test_a_population_takes_checkpoints_and_its_report_draws_the_lineage(tmp_path):
    config = tmp_path / "pbt.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                **SHORT,
                "exp_name": "pbt",
                "policy": {
                    **SHORT["policy"],
                    "learn": {"checkpoint_every_iters": 50},
                },
                "system": {"max_env_step": 4000},
                "sweep": {"axes": {"policy.learn.learning_rate": [0.0001, 0.003]}},
                "pbt": {"ready": 1, "params": ["policy.learn.learning_rate"]},
            }
        )
    )
    runs = tmp_path / "runs"
    swept = drover("sweep", str(config), "--runs-dir", str(runs), "--learners", "2", timeout_s=300)
    assert swept.returncode == 0, swept.stderr[-3000:]
    (run_dir,) = runs.iterdir()
    # Its lineage: a step a line, appended beside the experiment's record.
    (steps,) = (run_dir / "experiments").glob("*.lineage.jsonl")
    lineage = [json.loads(line) for line in steps.read_text().splitlines()]
    taken = [step for step in lineage if step["checkpoint"]]
    assert taken, lineage
    # A member's learner resumed from the copy of what it took, under the step's epoch.
    learner_logs = "".join(p.read_text() for p in (run_dir / "logs").glob("learner-*.log"))
    iters = {step["checkpoint"].rsplit("-", 1)[1] for step in taken}
    assert any(f"-{i} at train_iter" in learner_logs for i in iters), learner_logs[-3000:]
    # And it trained with the rate the step gave it.
    last = {}
    for step in lineage:
        last[step["job_id"]] = step["after"]["policy.learn.learning_rate"]
    for job_id, rate in last.items():
        job = json.loads((run_dir / job_id / "job.json").read_text())
        assert job["policy"]["learn"]["learning_rate"] == rate
    reported = drover("report", str(run_dir), timeout_s=120)
    assert reported.returncode == 0, reported.stderr
    assert f"{len(lineage)} steps" in reported.stdout
    assert (run_dir / "report" / "lineage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
