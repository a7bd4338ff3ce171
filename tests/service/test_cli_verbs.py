"""`drover jobs | status | stop | workers | logs` against a real coordinator served on
a free port of 127.0.0.1 (in this process, without its scheduler: a job stays as it
was submitted), run through `drover.cli.main` as a user runs them."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from rich.console import Console

from common.http_server import ServerLimits, create_server
from common.messages import JobStatus, LearnerSummary
from common.storage import SharedStore
from drover import verbs
from drover.cli import main
from drover.local import free_port
from drover.tables import learners_table, progress_text
from services.coordinator.app import create_app
from services.coordinator.client import CoordinatorClient
from services.coordinator.core import CoordinatorLimits
from services.coordinator.settings import CoordinatorSettings
from tests.buffer_hosts import make_coordinator

TOKEN = "verbs-test-token"
CARTPOLE_DQN = {
    "exp_name": "cartpole_dqn_verbs",
    "env": {"env_id": "CartPole-v1", "stop_value": 195, "n_evaluator_episode": 2},
    "policy": {
        "type": "dqn",
        "other": {"replay_buffer": {"min_size_to_sample": 20, "replay_buffer_size": 100}},
    },
    "system": {"max_env_step": 50_000},
}


@pytest.fixture
def coordinator(tmp_path, monkeypatch):
    """The coordinator's URL, and an operator's client of it; the verbs' environment
    names it and holds the token."""
    settings = CoordinatorSettings(shared_dir=tmp_path / "shared", token=TOKEN)
    core = make_coordinator(SharedStore(settings.shared_dir), settings.limits)
    yield from serve(core, settings, monkeypatch)


@pytest.fixture
def queueing(tmp_path, monkeypatch):
    """As `coordinator`, one that runs one job at a time; and its core, to plan."""
    limits = CoordinatorLimits(max_running_jobs=1)
    settings = CoordinatorSettings(shared_dir=tmp_path / "shared", token=TOKEN, limits=limits)
    core = make_coordinator(SharedStore(settings.shared_dir), settings.limits)
    for url, client in serve(core, settings, monkeypatch):
        yield url, client, core


def serve(core, settings, monkeypatch):
    """Serve `core`'s app on a free port while the caller runs."""
    app = create_app(settings, core=core)
    server = create_server(app, "127.0.0.1", 0, ServerLimits(threads=4))  # 0: a free port
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.effective_port}"
    monkeypatch.setenv("DROVER_COORDINATOR_URL", url)
    monkeypatch.setenv("DROVER_TOKEN", TOKEN)
    monkeypatch.delenv("DROVER_TOKEN_FILE", raising=False)
    client = CoordinatorClient(url, TOKEN, timeout_s=5.0)
    try:
        yield url, client
    finally:
        client.close()
        server.close()
        thread.join(timeout=5.0)
        core.close()


@pytest.fixture
def job_id(coordinator):
    _, client = coordinator
    return client.submit_job(CARTPOLE_DQN, name="verbs").job_id


def drover(capsys, *argv: str) -> tuple[int, str, str]:
    """`drover ARGV` in this process: exit status, stdout, stderr."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_jobs_lists_the_job_as_a_table_and_as_json(capsys, job_id):
    status, out, err = drover(capsys, "jobs")
    assert status == 0, err
    assert job_id in out and "CartPole-v1" in out and "verbs" in out
    status, out, err = drover(capsys, "jobs", "--json")
    assert status == 0, err
    jobs = json.loads(out)["jobs"]
    assert [j["job_id"] for j in jobs] == [job_id]
    assert jobs[0]["env_id"] == "CartPole-v1"


def test_status_shows_the_job_and_its_buffer(capsys, job_id):
    status, out, err = drover(capsys, "status", job_id)
    assert status == 0, err
    assert job_id in out and "phase" in out and "best eval" in out
    assert "buffer" in out and "/ 100" in out  # size / capacity
    assert "0 of 50,000 (0%)" in out  # env steps against the budget
    assert "0 failed, 0 reassigned" in out
    status, out, err = drover(capsys, "status", job_id, "--json")
    assert status == 0, err
    data = json.loads(out)
    assert data["job_id"] == job_id and data["stop_value"] == 195
    assert data["buffer"]["capacity"] == 100
    assert (data["max_env_step"], data["max_train_iter"]) == (50_000, None)


def test_jobs_and_status_say_each_jobs_share_and_why_it_waits(capsys, queueing):
    _, client, core = queueing
    client.register("collector", "http://127.0.0.1:9100", {}, slave_token="s" * 32)
    client.register("learner", "http://127.0.0.1:9200", {}, slave_token="s" * 32)
    running = client.submit_job(CARTPOLE_DQN, name="first").job_id
    queued = client.submit_job({**CARTPOLE_DQN, "system": {"priority": 3}}, name="second")
    assert queued.phase == "queued"
    core.plan()
    status, out, err = drover(capsys, "jobs")
    assert status == 0, err
    assert "queued #1" in out and "1 of 1.00" in out  # held of owed
    assert f"{queued.job_id}: queued: 1st of 1 waiting for one of the 1 places" in out
    status, out, err = drover(capsys, "status", running)
    assert status == 0, err
    assert "collectors" in out and "1 of 1.00" in out and "priority, share  0, 1" in out
    status, out, err = drover(capsys, "status", queued.job_id, "--json")
    data = json.loads(out)
    assert (data["phase"], data["queue_position"], data["priority"]) == ("queued", 1, 3)
    status, out, err = drover(capsys, "workers")
    assert status == 0 and running in out  # the job each worker's task is for


def test_stop_stops_the_job(capsys, coordinator, job_id):
    _, client = coordinator
    status, out, err = drover(capsys, "stop", job_id)
    assert status == 0, err
    assert f"{job_id} stopped" in out
    assert client.job(job_id).phase == "stopped"
    status, out, err = drover(capsys, "stop", job_id, "--json")  # once more: still stopped
    assert status == 0, err
    assert json.loads(out)["phase"] == "stopped"


def test_workers_lists_the_registered_workers(capsys, coordinator):
    _, client = coordinator
    status, out, err = drover(capsys, "workers", "--json")
    assert status == 0, err
    assert json.loads(out) == {"workers": []}
    status, out, err = drover(capsys, "workers")
    assert status == 0 and "no workers" in err
    worker = client.register(
        "collector", "http://127.0.0.1:9", {"cpu_count": 2}, slave_token="s" * 32
    )
    status, out, err = drover(capsys, "workers")
    assert status == 0, err
    assert worker.worker_id in out and "collector" in out and "idle" in out
    status, out, err = drover(capsys, "workers", "--json")
    assert [w["worker_id"] for w in json.loads(out)["workers"]] == [worker.worker_id]


def test_a_wrong_or_missing_token_is_one_clear_line(capsys, monkeypatch, job_id):
    monkeypatch.setenv("DROVER_TOKEN", "not-the-token")
    status, out, err = drover(capsys, "jobs")
    assert status == 2 and out == ""
    assert "refused the token (401 unauthorized)" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    monkeypatch.delenv("DROVER_TOKEN")
    status, out, err = drover(capsys, "status", job_id)
    assert status == 2 and "set DROVER_TOKEN or DROVER_TOKEN_FILE" in err


def test_an_unknown_job_is_one_clear_line(capsys, job_id):
    for verb in ("status", "stop"):
        status, out, err = drover(capsys, verb, "job-000000000000")
        assert status == 1 and out == ""
        assert "job-000000000000 does not exist" in err and "404" in err
        assert len(err.strip().splitlines()) == 1


def test_no_coordinator_is_one_clear_line(capsys, monkeypatch):
    monkeypatch.setenv("DROVER_TOKEN", TOKEN)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    status, out, err = drover(capsys, "jobs", "--url", url, "--timeout-s", "2")
    assert status == 1 and out == ""
    assert f"no coordinator at {url}: Connection refused" in err, err
    assert time.monotonic() - started < 5.0


def write_run(root, name, logs):
    log_dir = root / name / "logs"
    log_dir.mkdir(parents=True)
    for stem, text in logs.items():
        (log_dir / f"{stem}.log").write_text(text)
    return root / name


def test_logs_prints_the_last_lines_of_a_role(capsys, tmp_path):
    runs = tmp_path / "runs"
    write_run(runs, "old-run", {"coordinator": "old\n"})
    time.sleep(0.01)  # the newer run's files are newer
    run = write_run(
        runs,
        "new-run",
        {
            "coordinator": "".join(f"line {i}\n" for i in range(100)),
            "collector-0": "c0 a\nc0 b\n",
            "collector-1": "c1 a\n",
            "learner-0": "l0\n",
        },
    )
    status, out, err = drover(capsys, "logs", "coordinator", "--runs-dir", str(runs), "-n", "3")
    assert status == 0, err
    assert out.splitlines() == ["line 97", "line 98", "line 99"]
    status, out, err = drover(capsys, "logs", "collector", "--run-dir", str(run))
    assert status == 0, err
    assert "collector-0.log <==" in out and "collector-1.log <==" in out
    assert "c0 b" in out and "c1 a" in out and "l0" not in out
    status, out, err = drover(capsys, "logs", "collector-1", "--run-dir", str(run))
    assert status == 0 and out.splitlines() == ["c1 a"]


def test_logs_follows_appended_lines_for_a_bounded_time(capsys, tmp_path, monkeypatch):
    run = write_run(tmp_path, "run", {"learner-0": "first\n"})
    log = run / "logs" / "learner-0.log"
    following = threading.Event()
    follow = verbs.follow

    def follow_and_say_so(*args, **kwargs):
        following.set()
        return follow(*args, **kwargs)

    # Lines are appended once the command follows the file (after printing what it
    # held), not after a fixed sleep that a busy machine could outrun.
    monkeypatch.setattr(verbs, "follow", follow_and_say_so)

    def append() -> None:
        assert following.wait(10.0)
        time.sleep(0.2)
        with log.open("a") as f:
            f.write("second\nthird (no newline yet)")

    writer = threading.Thread(target=append)
    writer.start()
    status, out, err = drover(
        capsys, "logs", "learner", "--run-dir", str(run), "--follow", "--follow-s", "1.5"
    )
    writer.join(timeout=5.0)
    assert status == 0, err
    assert out.splitlines() == ["first", "second"]  # a partial line waits for its end


def test_logs_without_a_run_folder_or_role_is_a_usage_error(capsys, tmp_path):
    run = write_run(tmp_path / "runs", "run", {"coordinator": "x\n"})
    cases = [
        (["--run-dir", str(tmp_path / "nowhere")], "is not a run folder"),
        (["--runs-dir", str(tmp_path / "empty")], "no run folders with logs under"),
    ]
    for options, message in cases:
        status, out, err = drover(capsys, "logs", "coordinator", *options)
        assert status == 2 and message in err and out == ""
    status, out, err = drover(capsys, "logs", "learner", "--run-dir", str(run))
    assert status == 2 and "no learner logs" in err and "there are: coordinator" in err
    status, out, err = drover(capsys, "logs", "buffer", "--run-dir", str(run))
    assert status == 2 and "no role 'buffer'" in err


def test_learners_and_progress_read_as_rates():
    assert progress_text({"env_steps_per_s": 1234.4, "episodes": 3}) == (
        "1,234 env steps/s, 3 episodes"
    )
    assert progress_text({"loss": 0.5}) == "-"
    job = JobStatus(
        job_id="job-1",
        name="n",
        phase="running",
        algo="dqn",
        env_id="CartPole-v1",
        env_steps=10,
        train_iters=2,
        policy_version=1,
        last_eval=None,
        best_eval_return=None,
        best_policy_version=None,
        stop_value=None,
        reason="",
        started_at=time.time(),
        finished_at=None,
        learners=[
            LearnerSummary(
                worker_id="learner-a",
                world_size=2,
                rank_devices=["cuda:0", "cuda:1"],
                train_iters_per_s=12.5,
                samples_per_s=800.0,
            )
        ],
    )
    console = Console(record=True, width=120)
    console.print(learners_table(job))
    text = console.export_text()
    assert "learner-a" in text and "cuda:0, cuda:1" in text and "800.0" in text


def test_a_coordinator_that_never_answers_is_bounded_by_the_timeout(capsys, monkeypatch):
    monkeypatch.setenv("DROVER_TOKEN", TOKEN)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        status, out, err = drover(capsys, "workers", "--url", url, "--timeout-s", "0.5")
    assert status == 1 and out == ""
    assert f"no coordinator at {url}: no answer within 0.5s" in err, err
    assert time.monotonic() - started < 3.0


def test_sweep_url_experiment_and_stop_an_experiment(capsys, coordinator, tmp_path):
    url, client = coordinator
    config = tmp_path / "sweep.yaml"
    sweep = {"seeds": 2, "axes": {"policy.learn.learning_rate": [0.001, 0.002]}}
    config.write_text(json.dumps({**CARTPOLE_DQN, "sweep": sweep}))
    assert main(["sweep", str(config), "--url", url]) == 0
    experiment_id = capsys.readouterr().out.strip()
    assert experiment_id.startswith("exp-")
    assert main(["experiment", experiment_id, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert len(shown["members"]) == 4 and shown["phase"] == "running"
    assert main(["experiment", experiment_id]) == 0
    assert "learning_rate" in capsys.readouterr().out
    assert main(["stop", experiment_id, "--json"]) == 0
    stopped = json.loads(capsys.readouterr().out)
    assert stopped["phase"] == "stopped"
    assert {m["phase"] for m in stopped["members"]} == {"stopped"}
    assert main(["experiment", "exp-nope"]) == 1
    assert "exp-nope does not exist" in capsys.readouterr().err
