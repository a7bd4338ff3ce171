"""`drover report` over a run folder whose jobs' records are made here: configs grouped
by their experiment's point, the figures worked out by hand, the PNGs written."""

import json

from common.messages import PopulationStep, dump
from common.storage import SharedStore
from drover.cli import main
from jobconfig.population import Population
from services.coordinator.experiments import FOLDER, experiment_record, lineage_path
from services.coordinator.snapshot import write_job_record
from services.coordinator.state import Experiment, ExperimentJob

LR = "policy.learn.learning_rate"


def job(store, job_id, name, returns, *, phase="succeeded", stop_value=100.0):
    """A job whose evaluations, every 1,000 env steps, returned `returns`."""
    evals = [
        {
            "return_mean": r,
            "return_std": 0.0,
            "episodes": 5,
            "policy_version": i + 1,
            "train_iter": 100 * (i + 1),
            "env_steps": 1000 * (i + 1),
        }
        for i, r in enumerate(returns)
    ]
    steps = 1000 * len(returns)
    record = {
        "job_id": job_id,
        "name": name,
        "phase": phase,
        "config": {
            "env": {"env_id": "CartPole-v1", "stop_value": stop_value},
            "policy": {"type": "dqn"},
        },
        "evals": evals,
        "started_at": 0.0,
        "finished_at": steps / 100.0,  # 100 env steps a second
        "env_steps": steps,
        "metrics": [
            {
                "t": s / 100.0,
                "env_steps": s,
                "train_iters": 0,
                "buffer_size": 0,
                "policy_version": 0,
            }
            for s in range(0, steps + 1, 500)
        ],
    }
    write_job_record(store, job_id, record)


def test_a_report_groups_an_experiments_seeds_and_gives_each_config_its_figures(tmp_path):
    store = SharedStore(tmp_path)
    members = []
    # lr 0.001: reaches 100 at 3,000, 4,000 and never (final 90) over three seeds.
    for seed, returns in enumerate(([10, 50, 100], [10, 40, 60, 120], [10, 20, 90])):
        job(store, f"job-a{seed}", "x", returns)
        members.append(ExperimentJob(f"job-a{seed}", {LR: 0.001}, seed))
    # lr 0.01: reaches 100 at 1,000 and 2,000.
    for seed, returns in enumerate(([100, 150], [50, 110])):
        job(store, f"job-b{seed}", "x", returns)
        members.append(ExperimentJob(f"job-b{seed}", {LR: 0.01}, seed))
    job(store, "job-alone", "other", [5, 6], phase="failed")  # not in the experiment
    experiment = Experiment("exp-1", "lr", 0.0, None, members)
    store.write_json(f"{FOLDER}/exp-1.json", experiment_record(experiment))

    assert main(["report", str(tmp_path), "--experiment", "exp-1"]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    rows = {
        line.split(" | ")[0].strip("| "): line
        for line in report.splitlines()
        if line.startswith("| learning_rate=")
    }
    assert set(rows) == {"learning_rate=0.001", "learning_rate=0.01"}
    slow, fast = rows["learning_rate=0.001"].split(" | "), rows["learning_rate=0.01"].split(" | ")
    assert slow[1:3] == ["3", "3/3"] and fast[1:3] == ["2", "2/2"]
    assert slow[3].startswith("100.0 [")  # median final return of 100, 120, 90
    # The return's area per env step: 52.5, 55 and 35 (median 52.5); 125 and 80.
    assert slow[5].startswith("52.5 [35.0, 55.0]") and fast[5].startswith("102.5 [80.0, 125.0]")
    assert slow[7] == "2/3" and slow[8].startswith("3,500 [3,000, 4,000]")  # env steps to 100
    assert fast[8].startswith("1,500 [1,000, 2,000]")
    assert slow[10].startswith("35.0 [30.0, 40.0]")  # wall s to 100 (100 steps a second)
    assert "job-alone" not in report and "other" not in report
    for image in ("curves.png", "profile.png"):
        assert (tmp_path / "report" / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Without --experiment: every job, the one outside it under its name.
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "all")]) == 0
    assert "| other | 1 | 0/1 |" in (tmp_path / "all" / "report.md").read_text()


def test_several_run_folders_are_one_report_a_name_in_two_one_config(tmp_path):
    first, second = SharedStore(tmp_path / "a"), SharedStore(tmp_path / "b")
    job(first, "job-1", "tuned", [50, 100])
    job(second, "job-2", "tuned", [100])
    job(second, "job-3", "shipped", [10, 20, 100])
    out = tmp_path / "both"
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "# a, b" in report
    assert "| tuned | 2 | 2/2 |" in report and "| shipped | 1 | 1/1 |" in report


def test_a_population_report_tables_and_draws_its_lineage(tmp_path):
    store = SharedStore(tmp_path)
    job(store, "job-w", "x", [10, 20, 200])
    job(store, "job-s", "x", [100, 200, 250])
    members = [ExperimentJob("job-w", {LR: 0.001}, 0), ExperimentJob("job-s", {LR: 0.01}, 0)]
    step = PopulationStep(
        at=1.0,
        job_id="job-w",
        env_steps=2000,
        eval_return=20.0,
        donor_id="job-s",
        donor_env_steps=2000,
        donor_return=200.0,
        checkpoint="learner-e00000001-0000000200.safetensors",
        before={LR: 0.001},
        after={LR: 0.0125},
    )
    population = Population(params=(LR,))
    experiment = Experiment("exp-p", "pbt", 0.0, None, members, population=population)
    store.write_json(f"{FOLDER}/exp-p.json", experiment_record(experiment))
    # Its lineage, appended step by step beside its record (as the coordinator does).
    store.append_line(lineage_path("exp-p"), json.dumps(dump(step)).encode())
    assert main(["report", str(tmp_path)]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## Population-based training: pbt (exp-p)" in report
    assert (
        "| 2,000 | job-w (20.0) | job-s (200.0) | learner-e00000001-0000000200.safetensors | "
        "learning_rate 0.001 -> 0.0125 |" in report
    )
    assert (tmp_path / "report" / "lineage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_folder_without_jobs_or_that_experiment_is_a_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    job(SharedStore(tmp_path), "job-1", "x", [1.0])
    assert main(["report", str(tmp_path), "--experiment", "exp-nope"]) == 2
    said = capsys.readouterr()
    assert "no experiment exp-nope" in said.err + said.out


def test_the_cli_loads_without_the_report_and_tune_extras():
    """The images carry neither scipy nor optuna: `drover` must start without them (only
    `drover report` and `drover tune` need them, and import them when they run)."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    blocked = (
        "import sys\nfor name in ('scipy', 'optuna', 'matplotlib'):\n    sys.modules[name] = None\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", blocked + "import drover.cli, drover.report, drover.tune"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert loaded.returncode == 0, loaded.stderr
