"""Experiments through the coordinator's routes: a sweep's jobs created together (at
most `parallel` running), shown with their points, stopped together, refused whole for
a bad axis or value before any job exists, and back after a restart; a tuning's trials
made as its study asks, shown as its members, and its study going on after a restart."""

import optuna

import services.coordinator.tuning as tuner_module
from common.messages import EvalSummary
from common.storage import SharedStore
from services.coordinator.app import create_app
from services.coordinator.core import CoordinatorLimits
from services.coordinator.settings import CoordinatorSettings
from tests.buffer_hosts import crash, make_coordinator
from tests.coordinator_app import AUTH, CONFIG, TOKEN, get, post
from tests.helpers import wait_until

LRS = [0.001, 0.002]


def sweep(**section):
    return {**CONFIG, "sweep": {"seeds": 2, "axes": {"policy.learn.learning_rate": LRS}, **section}}


def submit(client, config):
    return post(client, "/api/v1/experiments", {"config": config, "name": "lr"})


def test_a_sweeps_jobs_are_created_together_and_run_parallel_at_a_time(client, core):
    created = submit(client, sweep(parallel=1))
    assert created.status_code == 201, created.json
    experiment_id, job_ids = created.json["experiment_id"], created.json["job_ids"]
    assert len(job_ids) == 4
    core.plan()
    shown = get(client, f"/api/v1/experiments/{experiment_id}").json
    assert shown["phase"] == "running" and shown["parallel"] == 1
    points = {(m["values"]["policy.learn.learning_rate"], m["seed"]) for m in shown["members"]}
    assert points == {(lr, seed) for lr in LRS for seed in (0, 1)}
    phases = [m["phase"] for m in shown["members"]]
    assert phases.count("running") == 1 and phases.count("queued") == 3
    waiting = get(client, f"/api/v1/jobs/{job_ids[1]}").json
    assert "sweep.parallel" in waiting["reason"] and waiting["experiment_id"] == experiment_id
    config = core.store.read_json(f"{job_ids[2]}/job.json")
    assert config["policy"]["learn"]["learning_rate"] == LRS[1] and config["system"]["seed"] == 0
    # The running one ends: the next takes its place at the next pass.
    client.delete(f"/api/v1/jobs/{job_ids[0]}", headers=AUTH)
    core.plan()
    phases = [
        m["phase"] for m in get(client, f"/api/v1/experiments/{experiment_id}").json["members"]
    ]
    assert phases == ["stopped", "running", "queued", "queued"]
    # Its time runs from when it left the queue (what a report's wall times count).
    assert core.jobs[job_ids[1]].running_since >= core.jobs[job_ids[1]].started_at
    assert core.jobs[job_ids[2]].running_since is None
    listed = get(client, "/api/v1/experiments").json["experiments"]
    assert [e["experiment_id"] for e in listed] == [experiment_id]
    # A job the coordinator no longer keeps (ended past the count kept) is shown so.
    del core.jobs[job_ids[0]]
    member = get(client, f"/api/v1/experiments/{experiment_id}").json["members"][0]
    assert (member["job_id"], member["phase"]) == (job_ids[0], "forgotten")


def test_stopping_an_experiment_stops_every_job_of_it(client, core):
    experiment_id = submit(client, sweep()).json["experiment_id"]
    core.plan()
    stopped = client.delete(f"/api/v1/experiments/{experiment_id}", headers=AUTH)
    assert stopped.status_code == 202, stopped.json
    shown = get(client, f"/api/v1/experiments/{experiment_id}").json
    assert shown["phase"] == "stopped"
    assert {m["phase"] for m in shown["members"]} == {"stopped"}


def test_a_bad_axis_or_value_is_refused_before_any_job_exists(client, core):
    for config, field in (
        (sweep(axes={"policy.learn.learning_rat": LRS}), "sweep.axes.policy.learn.learning_rat"),
        (
            sweep(axes={"policy.learn.learning_rate": [0.001, -1.0]}),
            "config.policy.learn.learning_rate",
        ),
        (sweep(axes={"env.env_id": {"uniform": [0, 1]}}), "sweep.axes.env.env_id"),
        ({**CONFIG}, "sweep"),
    ):
        refused = submit(client, config)
        assert refused.status_code == 400, refused.json
        assert refused.json["message"].startswith(f"{field}:"), refused.json
    assert get(client, "/api/v1/jobs").json["jobs"] == []
    assert get(client, "/api/v1/experiments").json["experiments"] == []
    assert get(client, "/api/v1/experiments/exp-nope").status_code == 404


def test_an_experiment_is_back_after_a_restart(tmp_path, client, core):
    created = submit(client, sweep(parallel=1)).json
    core.plan()
    core.snapshot_jobs()
    core.close()
    again = make_coordinator(SharedStore(tmp_path), CoordinatorLimits(max_buffer_items=1000))
    try:
        again.restore_jobs()
        again.plan()
        shown = again.experiment_status(created["experiment_id"])
        assert [m.job_id for m in shown.members] == created["job_ids"]
        assert [m.phase for m in shown.members].count("running") == 1  # still one at a time
        assert shown.parallel == 1
    finally:
        again.close()


def test_an_experiment_over_the_coordinators_job_limit_is_refused_naming_it(tmp_path):
    """`DROVER_MAX_EXPERIMENT_JOBS` (here 3): a sweep of 4 jobs is a 400 naming `sweep`
    and the limit, and nothing of it exists; one of 3 is taken."""
    from services.coordinator.app import create_app
    from services.coordinator.settings import CoordinatorSettings, limits_from_env
    from tests.coordinator_app import TOKEN

    limits = limits_from_env({"DROVER_MAX_EXPERIMENT_JOBS": "3", "DROVER_MAX_BUFFER_ITEMS": "1000"})
    assert limits.max_experiment_jobs == 3
    core = make_coordinator(SharedStore(tmp_path), limits)
    try:
        client = create_app(CoordinatorSettings(shared_dir=tmp_path, token=TOKEN), core=core)
        client = client.test_client()
        refused = submit(client, sweep())  # 2 learning rates x 2 seeds
        assert refused.status_code == 400, refused.json
        assert refused.json["message"] == "sweep: 4 jobs: at most 3 an experiment"
        assert get(client, "/api/v1/jobs").json["jobs"] == []
        assert get(client, "/api/v1/experiments").json["experiments"] == []
        taken = submit(client, sweep(seeds=3, axes={"policy.learn.learning_rate": [1e-3]}))
        assert taken.status_code == 201 and len(taken.json["job_ids"]) == 3, taken.json
    finally:
        core.close()


def test_queued_jobs_hold_no_buffer_until_they_leave_the_queue(client, core):
    """A sweep of a thousand must not start a thousand buffers (with buffer processes:
    a thousand processes) for jobs that only wait."""
    job_ids = submit(client, sweep(parallel=1)).json["job_ids"]
    held = [core.jobs[j].replay is not None for j in job_ids]
    assert held == [True, False, False, False]
    client.delete(f"/api/v1/jobs/{job_ids[0]}", headers=AUTH)
    core.plan()
    assert core.jobs[job_ids[1]].phase == "running" and core.jobs[job_ids[1]].replay is not None
    assert core.jobs[job_ids[2]].replay is None
    # A restarted coordinator restores them the same way.
    again = make_coordinator(core.store, core.limits)
    again.restore_jobs()
    assert [again.jobs[j].replay is not None for j in job_ids[1:]] == [True, False, False]


def test_an_experiment_whose_jobs_cannot_be_written_leaves_none_behind(client, core, monkeypatch):
    written = []

    def write_json(rel, record, real=core.store.write_json):
        if len(written) == 5:
            raise OSError(28, "No space left on device")
        written.append(rel)
        return real(rel, record)

    monkeypatch.setattr(core.store, "write_json", write_json)
    refused = submit(client, sweep())
    assert refused.status_code >= 500
    monkeypatch.undo()
    job_folders = [p for p in core.store.root.iterdir() if p.name.startswith("job-")]
    assert job_folders == [] and core.jobs == {}


def test_experiments_are_listed_a_page_at_a_time_with_their_jobs_counted(client, core):
    made = [submit(client, sweep(parallel=1)).json["experiment_id"] for _ in range(3)]
    first = get(client, "/api/v1/experiments?limit=2").json
    assert [e["experiment_id"] for e in first["experiments"]] == made[::-1][:2]
    assert first["experiments"][0]["jobs"] == 4 and first["experiments"][0]["jobs_ended"] == 0
    token = first["next_page_token"]
    rest = get(client, f"/api/v1/experiments?limit=2&page_token={token}").json
    assert [e["experiment_id"] for e in rest["experiments"]] == [made[0]]
    assert rest["next_page_token"] is None
    assert get(client, "/api/v1/experiments?limit=0").status_code == 400
    assert get(client, "/api/v1/experiments?page_token=nonsense").status_code == 400


def test_an_experiment_is_forgotten_with_its_jobs(tmp_path):
    """Past the ended jobs a coordinator keeps (here 1), an experiment none of whose
    jobs it keeps goes too, with its record: experiments are never unbounded."""
    from services.coordinator.app import create_app
    from services.coordinator.settings import CoordinatorSettings
    from tests.coordinator_app import TOKEN

    limits = CoordinatorLimits(max_ended_jobs=1, metrics_period_s=0.0)  # forgets each pass
    core = make_coordinator(SharedStore(tmp_path), limits)
    try:
        client = create_app(CoordinatorSettings(shared_dir=tmp_path, token=TOKEN), core=core)
        client = client.test_client()
        created = submit(client, sweep(seeds=1)).json
        experiment_id = created["experiment_id"]
        for job_id in created["job_ids"]:
            client.delete(f"/api/v1/jobs/{job_id}", headers=AUTH)
        core.plan()  # one forgotten: the other still kept, and the experiment with it
        assert len(core.jobs) == 1 and experiment_id in core.state.experiments
        later = submit(client, sweep(seeds=1, axes={"policy.learn.learning_rate": [0.003]}))
        client.delete(f"/api/v1/jobs/{later.json['job_ids'][0]}", headers=AUTH)
        core.plan()
        assert experiment_id not in core.state.experiments
        assert get(client, f"/api/v1/experiments/{experiment_id}").status_code == 404
        assert not (tmp_path / "experiments" / f"{experiment_id}.json").exists()
    finally:
        core.close()


def tuning(**section):
    params = {"policy.learn.learning_rate": {"log_uniform": [1e-4, 1e-2]}}
    tune = {"params": params, "n_trials": 3, "objective": "final_return", "pruner": "none"}
    return {**CONFIG, "tune": {**tune, **section}}


def members(client, experiment_id):
    return get(client, f"/api/v1/experiments/{experiment_id}").json["members"]


def evaluated_and_ended(core, job_id, return_mean):
    """The trial's job evaluated once, then succeeded (as its collector and goal would
    have it)."""
    with core.state.guard.changing():
        job = core.jobs[job_id]
        job.evals.append(
            EvalSummary(
                return_mean=return_mean,
                return_std=0.0,
                episodes=2,
                policy_version=1,
                train_iter=10,
                env_steps=100,
            )
        )
        core.job_book.finish(job, "succeeded", "stop_value 150 reached")


def test_a_tuning_runs_its_trials_as_an_experiments_jobs_and_goes_on_after_a_restart(
    tmp_path, client, core, monkeypatch
):
    monkeypatch.setattr(tuner_module, "POLL_S", 0.05)
    created = submit(client, tuning())
    assert created.status_code == 201, created.json
    experiment_id = created.json["experiment_id"]
    assert created.json["job_ids"] == []  # its trials' jobs come as the study asks
    wait_until(lambda: len(members(client, experiment_id)) == 1, what="the first trial")
    (first,) = members(client, experiment_id)
    assert first["trial"] == 0 and first["trial_state"] is None and first["phase"] == "running"
    evaluated_and_ended(core, first["job_id"], 42.0)
    wait_until(lambda: len(members(client, experiment_id)) == 2, what="the second trial")
    first, second = members(client, experiment_id)
    assert (first["trial_state"], first["objective"]) == ("complete", 42.0)
    shown = get(client, f"/api/v1/experiments/{experiment_id}").json
    assert shown["phase"] == "running" and shown["tuning"]["n_trials"] == 3
    study = tmp_path / "experiments" / experiment_id / "study.db"
    assert study.is_file()

    # The coordinator dies with the second trial running; a new one goes on with the
    # study: the trial cut short fails (its job stopped) and a third takes its place.
    core.experiment_book.close()
    crash(core)
    again = make_coordinator(SharedStore(tmp_path), CoordinatorLimits(max_buffer_items=1000))
    again.restore_jobs()
    settings = CoordinatorSettings(shared_dir=tmp_path, token=TOKEN)
    client = create_app(settings, core=again).test_client()
    wait_until(lambda: len(members(client, experiment_id)) == 3, what="the third trial")
    first, second, third = members(client, experiment_id)
    assert first["trial_state"] == "complete" and second["trial_state"] == "failed"
    assert second["phase"] == "stopped" and third["trial"] == 2
    evaluated_and_ended(again, third["job_id"], 7.0)
    # A failed trial does not count: a fourth makes the three.
    wait_until(lambda: len(members(client, experiment_id)) == 4, what="the fourth trial")
    evaluated_and_ended(again, members(client, experiment_id)[3]["job_id"], 9.0)
    wait_until(
        lambda: get(client, f"/api/v1/experiments/{experiment_id}").json["phase"] == "ended",
        what="the tuning's end",
    )
    stored = optuna.load_study(study_name=experiment_id, storage=f"sqlite:///{study}")
    states = [t.state.name for t in stored.get_trials()]
    assert states == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"] and stored.best_value == 42.0
    again.experiment_book.close()


def test_a_stopped_tuning_fails_its_running_trial_and_starts_no_more(client, core, monkeypatch):
    monkeypatch.setattr(tuner_module, "POLL_S", 0.05)
    experiment_id = submit(client, tuning()).json["experiment_id"]
    wait_until(lambda: len(members(client, experiment_id)) == 1, what="the first trial")
    stopped = client.delete(f"/api/v1/experiments/{experiment_id}", headers=AUTH)
    assert stopped.status_code == 202 and stopped.json["phase"] == "stopped", stopped.json
    (only,) = stopped.json["members"]
    assert only["trial_state"] == "failed" and only["phase"] == "stopped"


def test_a_tuning_names_its_faults_before_anything_starts(client, core):
    for config, field in (
        (tuning(storage="sqlite:////etc/study.db"), "tune.storage"),  # the study is ours
        ({**tuning(), "sweep": {"axes": {"policy.learn.learning_rate": LRS}}}, "sweep"),
        (tuning(params={"policy.learn.learning_rat": [0.1]}), "tune.params"),
    ):
        resp = submit(client, config)
        assert resp.status_code == 400 and field in resp.json["message"], resp.json
    assert core.state.experiments == {} and core.jobs == {}
