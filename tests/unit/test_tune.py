"""A tuning's study (services/coordinator/tuning.py) over a double of its experiment's
jobs, which evaluate as a script says: trials scored by their objective, behind ones
pruned and their jobs stopped at once, a study cut short going on from its storage;
`drover tune`'s best config written from the experiment's members; and the `tune:`
section's faults named (jobconfig/tuning.py, jobconfig/experiment.py)."""

import threading

import pytest
import yaml

from common.config import ConfigError
from common.messages import EvalSummary, ExperimentMember, ExperimentStatus, JobStatus
from drover.tune import finish
from jobconfig import load_config_file
from jobconfig.experiment import plan_experiment
from jobconfig.tuning import plan_tuning
from services.coordinator.tuning import Tuner, open_study, trial_state
from tests.helpers import EXAMPLE

LR = "policy.learn.learning_rate"
STEPS_PER_EVAL = 1000
BUDGET = 10_000


def tuning_config(**tune):
    return {
        **load_config_file(EXAMPLE),
        "system": {"max_env_step": BUDGET},
        "tune": {"params": {LR: {"log_uniform": [1e-4, 1e-1]}}, "n_trials": 8, **tune},
    }


class Jobs:
    """Jobs whose return rises by 1,000 x learning rate each evaluation (1,000 env
    steps apart): the higher the rate, the better, and the stop value (195) is reached
    in ceil(195 / (1000 * lr)) evaluations; one evaluation a poll (`TrialJobs`)."""

    def __init__(self):
        self.jobs = {}
        self.stopped = []
        self.ends = {}

    def submit(self, config, trial, values):
        job_id = f"job-{len(self.jobs)}"
        self.jobs[job_id] = {
            "lr": config["policy"]["learn"]["learning_rate"],
            "evals": [],
            "phase": "running",
        }
        return job_id

    def status(self, job_id):
        job = self.jobs[job_id]
        if job["phase"] == "running":
            n = len(job["evals"]) + 1
            ret = min(500.0, 1000 * job["lr"] * n)
            job["evals"].append(
                EvalSummary(
                    return_mean=ret,
                    return_std=0.0,
                    episodes=5,
                    policy_version=n,
                    train_iter=100 * n,
                    env_steps=STEPS_PER_EVAL * n,
                )
            )
            if ret >= 195:
                job["phase"] = "succeeded"
            elif n * STEPS_PER_EVAL >= BUDGET:
                job["phase"] = "failed"
        steps = len(job["evals"]) * STEPS_PER_EVAL
        reason = (
            "max_env_step 10000 reached before stop_value 195" if job["phase"] == "failed" else ""
        )
        return JobStatus(
            job_id=job_id,
            name="t",
            phase=job["phase"],
            algo="dqn",
            env_id="CartPole-v1",
            env_steps=steps,
            train_iters=0,
            policy_version=0,
            last_eval=None,
            best_eval_return=None,
            best_policy_version=None,
            stop_value=195.0,
            reason=reason,
            started_at=0.0,
            finished_at=None,
            max_env_step=BUDGET,
        )

    def evals(self, job_id):
        return list(self.jobs[job_id]["evals"])

    def stop(self, job_id):
        self.stopped.append(job_id)
        self.jobs[job_id]["phase"] = "stopped"

    def settled(self, job_id, state, value):
        self.ends[job_id] = (state, value)


def tune(tmp_path, jobs, **section):
    tuning, base = plan_tuning(tuning_config(**section))
    study = open_study(tuning, "t", f"sqlite:///{tmp_path / 'study.db'}")
    tuner = Tuner(jobs, study, tuning, base, poll_s=0.0)
    return tuning, base, study, tuner


def ran(tuner):
    return tuner.run(threading.Event())


def members(study, jobs):
    """The experiment's members as the coordinator shows them, from the trials."""
    return [
        ExperimentMember(
            job_id=t.user_attrs["job_id"],
            values=t.params,
            seed=0,
            phase="succeeded",
            trial=t.number,
            trial_state=jobs.ends[t.user_attrs["job_id"]][0],
            objective=jobs.ends[t.user_attrs["job_id"]][1],
        )
        for t in study.get_trials()
    ]


def test_trials_are_scored_by_env_steps_to_the_stop_value_and_the_best_config_written(
    tmp_path,
):
    jobs = Jobs()
    tuning, base, study, tuner = tune(tmp_path, jobs, pruner="none", n_parallel=3)
    assert ran(tuner)
    trials = study.get_trials()
    assert len(trials) == 8 and all(t.state == trial_state("COMPLETE") for t in trials)
    for trial in trials:
        lr = trial.params[LR]
        evals_to_goal = -(-195 // (1000 * lr))  # ceil
        expected = min(evals_to_goal * STEPS_PER_EVAL, BUDGET)  # never: the budget
        assert trial.value == pytest.approx(expected), (lr, trial.value)
    status = ExperimentStatus(
        experiment_id="t",
        name="t",
        phase="ended",
        created_at=0.0,
        parallel=None,
        members=members(study, jobs),
        tuning={},
    )
    assert finish(status, tuning, base, tmp_path, tmp_path / "study.db") == 0
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert best["policy"]["learn"]["learning_rate"] == study.best_trial.params[LR]
    assert "tune" not in best and best["env"]["stop_value"] == 195
    assert (tmp_path / "history.png").is_file()


def test_a_trial_behind_the_others_is_pruned_and_its_job_stopped_at_once(tmp_path):
    jobs = Jobs()
    _, _, study, tuner = tune(tmp_path, jobs, pruner="median", n_parallel=2, n_trials=12)
    assert ran(tuner)
    pruned = [t for t in study.get_trials() if t.state == trial_state("PRUNED")]
    assert pruned, [(t.params, t.state) for t in study.get_trials()]
    for trial in pruned:
        job_id = trial.user_attrs["job_id"]
        assert job_id in jobs.stopped and jobs.ends[job_id] == ("pruned", None)
        assert len(jobs.jobs[job_id]["evals"]) * STEPS_PER_EVAL < BUDGET  # stopped early


def test_a_tune_cut_short_goes_on_from_its_storage(tmp_path):
    jobs = Jobs()
    tuning, base, study, tuner = tune(tmp_path, jobs, pruner="none", n_trials=4)
    tuner._start()  # a trial and its job, then the coordinator stops
    (left,) = tuner.running
    _, _, study, again = tune(tmp_path, jobs, pruner="none", n_trials=4)  # restarted
    assert ran(again)
    states = [t.state for t in study.get_trials()]
    assert states.count(trial_state("FAIL")) == 1 and states.count(trial_state("COMPLETE")) == 4
    assert left in jobs.stopped and jobs.ends[left] == ("failed", None)


def test_a_stopped_tuning_fails_its_running_trials(tmp_path):
    jobs = Jobs()
    _, _, study, tuner = tune(tmp_path, jobs, pruner="none", n_trials=4, n_parallel=2)
    stop = threading.Event()
    stop.set()
    assert not tuner.run(stop)  # stopped before it ran its trials
    tuner._start()  # one was running
    tuner.abandon()
    (trial,) = study.get_trials()
    assert trial.state == trial_state("FAIL") and jobs.stopped == ["job-0"]


@pytest.mark.parametrize(
    ("sections", "field"),
    [
        ({"sweep": {"axes": {LR: [0.1]}}}, "sweep"),
        ({"pbt": {}}, "pbt"),
    ],
)
def test_a_config_is_a_sweep_or_a_tuning_not_both(sections, field):
    with pytest.raises(ConfigError) as refused:
        plan_experiment({**tuning_config(), **sections})
    assert refused.value.field == field and "not both" in refused.value.message


def test_one_parser_reads_each_kind_of_experiment():
    plan = plan_experiment(tuning_config())
    assert plan.kind == "tune" and plan.tuning.n_trials == 8 and "tune" not in plan.base
    sweep = {**load_config_file(EXAMPLE), "sweep": {"axes": {LR: [0.1, 0.2]}, "seeds": 2}}
    plan = plan_experiment(sweep)
    assert plan.kind == "sweep" and len(plan.points) == 4 and "sweep" not in plan.base
    with pytest.raises(ConfigError) as refused:
        plan_experiment(load_config_file(EXAMPLE))
    assert refused.value.field == "sweep" and "tune:" in refused.value.message


@pytest.mark.parametrize(
    ("tune_section", "field", "says"),
    [
        (
            {"params": {"policy.learn.learning_rat": [0.1]}},
            "tune.params.policy.learn.learning_rat",
            "did you mean",
        ),
        ({"params": {}}, "tune.params", "a mapping"),
        ({"objective": "speed"}, "tune.objective", "one of"),
        ({"pruner": "hyperband"}, "tune.pruner", "one of"),
        ({"n_parallel": 0}, "tune.n_parallel", "an integer"),
        ({"storage": "sqlite:////etc/study.db"}, "tune.storage", "unknown key"),
        ({"trials": 3}, "tune.trials", "unknown key"),
    ],
)
def test_a_bad_tune_section_is_named(tune_section, field, says):
    config = tuning_config()
    config["tune"] = {**config["tune"], **tune_section}
    with pytest.raises(ConfigError) as refused:
        plan_tuning(config)
    assert refused.value.field == field and says in refused.value.message


def test_env_steps_to_stop_needs_a_stop_value():
    config = tuning_config()
    config["env"] = {**config["env"], "stop_value": None}
    with pytest.raises(ConfigError, match="stop_value"):
        plan_tuning(config)
