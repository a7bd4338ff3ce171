"""`drover plot` on run folders whose job files the coordinator itself wrote."""

from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from common.messages import EvalSummary, JobSubmit
from common.storage import SharedStore
from drover import plot
from drover.cli import main
from tests.buffer_hosts import make_coordinator

WIDTH_PX, HEIGHT_PX = 800, 500


def fake_job(
    run_dir: Path,
    name: str,
    returns: list[float],
    *,
    seed: int = 0,
    algo: str = "dqn",
    steps_per_eval: int = 1000,
    ended: bool = True,
) -> Path:
    """A job folder as a coordinator leaves it: submitted, evaluated once a second
    (`returns`, every `steps_per_eval` env steps), then stopped (or still running, with
    a snapshot). Returns the job's folder."""
    now = [1000.0]
    core = make_coordinator(SharedStore(run_dir), wall_clock=lambda: now[0])
    config = {
        "exp_name": name,
        "env": {"env_id": "CartPole-v1", "stop_value": 195},
        "policy": {"type": algo},
        "system": {"seed": seed},
    }
    job_id = core.submit_job(JobSubmit(config=config, name=name)).job_id
    job = core.jobs[job_id]
    for i, value in enumerate(returns, start=1):
        now[0] += 1.0
        # What inserts and an evaluate task's result change, and a metrics point.
        with core.state.guard.changing():
            job.env_steps = i * steps_per_eval
            job.train_iters = i * 100
            job.evals.append(
                EvalSummary(
                    return_mean=value,
                    return_std=1.0,
                    episodes=10,
                    policy_version=i,
                    train_iter=job.train_iters,
                    env_steps=job.env_steps,
                )
            )
            core.job_views.sample_metrics()
    if ended:
        core.stop_job(job_id)
    core.snapshot_jobs()
    core.close()
    return run_dir / job_id


def fake_run(runs_dir: Path, name: str, seed: int, returns: list[float], **kw) -> Path:
    """A run folder as `drover run` leaves it: logs/ and one job's folder."""
    run_dir = runs_dir / f"{name}-2026112{seed}-120000"
    (run_dir / "logs").mkdir(parents=True)
    fake_job(run_dir, name, returns, seed=seed, **kw)
    return run_dir


@pytest.fixture
def runs(tmp_path):
    """3 seeds of a DQN experiment, 1 run of a PPO one."""
    dqn = [
        fake_run(tmp_path, "cartpole_dqn", seed, [10.0 + seed, 60.0, 150.0 + seed, 200.0])
        for seed in range(3)
    ]
    ppo = fake_run(tmp_path, "cartpole_ppo", 0, [20.0, 90.0, 180.0], algo="ppo")
    return [*dqn, ppo]


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert imread(path).shape[:2] == (HEIGHT_PX, WIDTH_PX)


def test_several_runs_make_one_png_and_its_path_is_printed(runs, tmp_path, capsys):
    out = tmp_path / "figs" / "cartpole.png"
    assert main(["plot", *map(str, runs), "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"{out}\n"
    assert_png(out)
    assert [p.name for p in out.parent.iterdir()] == ["cartpole.png"]  # no temp file left


@pytest.mark.parametrize("x_axis", list(plot.X_AXES))
def test_every_x_axis_plots(runs, tmp_path, x_axis):
    out = tmp_path / f"{x_axis}.png"
    assert main(["plot", *map(str, runs), "--x", x_axis, "--out", str(out)]) == 0
    assert_png(out)


def test_the_default_output_is_in_the_run_folder_or_else_here(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    job_dir = next(p for p in runs[0].iterdir() if p.name.startswith("job-"))
    for given in (runs[0], job_dir):  # a run folder, or its job's folder
        assert main(["plot", str(given)]) == 0
        assert capsys.readouterr().out == f"{runs[0] / 'returns.png'}\n"
    assert_png(runs[0] / "returns.png")
    assert main(["plot", str(runs[0]), str(runs[1])]) == 0
    assert capsys.readouterr().out == "returns.png\n"
    assert_png(tmp_path / "returns.png")


def test_a_job_reads_as_its_evaluations_with_its_config(runs):
    (job_dir,) = plot.job_dirs(runs[1])
    curve = plot.curve_of(plot.read_record(job_dir), job_dir, "seeds", "env_steps")
    assert (curve.env_id, curve.algo, curve.stop_value) == ("CartPole-v1", "dqn", 195.0)
    assert curve.x.tolist() == [1000, 2000, 3000, 4000]
    assert curve.y.tolist() == [11.0, 60.0, 151.0, 200.0]
    # Evaluations were counted a second apart, from the job's start.
    wall = plot.curve_of(plot.read_record(job_dir), job_dir, "seeds", "wall_s")
    assert wall.x.tolist() == pytest.approx([1.0, 2.0, 3.0, 4.0])
    iters = plot.curve_of(plot.read_record(job_dir), job_dir, "seeds", "train_iter")
    assert iters.x.tolist() == [100, 200, 300, 400]


def test_seeds_are_averaged_where_they_all_have_data():
    def curve(x, y):
        return plot.Curve("a", Path("."), "E", "dqn", None, np.array(x, float), np.array(y, float))

    grid, mean, low, high = plot.spread([curve([0, 10], [0, 10]), curve([5, 20], [20, 20])])
    assert (grid[0], grid[-1]) == (5, 10)
    assert (mean[0], low[0], high[0]) == (12.5, 5, 20)
    assert (mean[-1], low[-1], high[-1]) == (15, 10, 20)
    assert plot.spread([curve([0, 1], [0, 0]), curve([2, 3], [0, 0])]) is None


def test_a_running_job_plots_from_its_newest_snapshot(tmp_path):
    run_dir = tmp_path / "run"
    job_dir = fake_job(run_dir, "live", [5.0, 9.0], ended=False)
    assert [e["return_mean"] for e in plot.read_record(job_dir)["evals"]] == [5.0, 9.0]
    out = tmp_path / "live.png"
    assert main(["plot", str(run_dir), "--out", str(out)]) == 0
    assert_png(out)


def test_jobs_are_labelled_by_name_or_by_label(runs, tmp_path):
    names = [c.label for c in plot.read_curves(runs)]
    assert names == ["cartpole_dqn"] * 3 + ["cartpole_ppo"]
    labelled = plot.read_curves(runs, labels=["a", "a", "b", "b"])
    assert [c.label for c in labelled] == ["a", "a", "b", "b"]
    out = tmp_path / "labelled.png"
    labels = ["--label", "a", "--label", "a", "--label", "b", "--label", "b"]
    assert main(["plot", *map(str, runs), *labels, "--out", str(out)]) == 0
    assert_png(out)


def error_of(capsys, *argv: str) -> str:
    assert main(["plot", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.startswith("drover: error:")
    return captured.err


def test_what_cannot_be_plotted_is_one_error_line_and_exit_2(runs, tmp_path, capsys):
    assert "no such file or folder" in error_of(capsys, str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    for path in (tmp_path / "empty", tmp_path / "notes.txt", runs[0] / "logs"):
        assert "not a run folder or a job folder" in error_of(capsys, str(path))
    assert "it holds run folders: name them" in error_of(capsys, str(tmp_path))
    silent = fake_run(tmp_path / "more", "silent", 0, [])
    said = error_of(capsys, str(runs[0]), str(silent))
    assert str(silent) in said and "has no evaluations" in said
    said = error_of(capsys, str(runs[0]), str(runs[1]), "--label", "only-one")
    assert "--label given 1 times for 2" in said
    assert "cannot write .txt" in error_of(capsys, str(runs[0]), "--out", str(tmp_path / "x.txt"))


def test_an_unreadable_record_is_an_error_line(runs, capsys):
    (job_dir,) = plot.job_dirs(runs[0])
    (job_dir / "coordinator" / "record.json").write_text("{not json")
    assert "cannot read the job's record" in error_of(capsys, str(runs[0]))
