"""`drover tune` against a coordinator double whose jobs evaluate as a script says:
trials scored by their objective, behind ones pruned and their jobs stopped at once, a
study cut short going on from its storage, the best config written; and the `tune:`
section's faults named (jobconfig/tuning.py)."""

import pytest
import yaml

from common.config import ConfigError
from common.messages import EvalSummary, JobCreated, JobStatus, dump
from drover.tune import Tuner, finish, open_study, trial_state
from jobconfig import load_config_file
from jobconfig.tuning import plan_tuning
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
    in ceil(195 / (1000 * lr)) evaluations; one evaluation a poll."""

    def __init__(self):
        self.jobs = {}
        self.stopped = []

    def submit_job(self, config, name=None):
        job_id = f"job-{len(self.jobs)}"
        self.jobs[job_id] = {
            "lr": config["policy"]["learn"]["learning_rate"],
            "evals": [],
            "phase": "running",
        }
        return JobCreated(job_id=job_id, phase="running", warnings=[])

    def job(self, job_id):
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

    def metrics(self, job_id):
        return {"evals": [dump(e) for e in self.jobs[job_id]["evals"]]}

    def stop_job(self, job_id):
        self.stopped.append(job_id)
        self.jobs[job_id]["phase"] = "stopped"


def tune(tmp_path, jobs, **section):
    tuning, base = plan_tuning(tuning_config(**section))
    study = open_study(tuning, "t", f"sqlite:///{tmp_path / 'study.db'}")
    tuner = Tuner(jobs, study, tuning, base, "t", poll_s=0.0, say=lambda line: None)
    return tuning, base, study, tuner


def test_trials_are_scored_by_env_steps_to_the_stop_value_and_the_best_config_written(
    tmp_path,
):
    jobs = Jobs()
    tuning, base, study, tuner = tune(tmp_path, jobs, pruner="none", n_parallel=3)
    tuner.run(deadline=float("inf"))
    trials = study.get_trials()
    assert len(trials) == 8 and all(t.state == trial_state("COMPLETE") for t in trials)
    for trial in trials:
        lr = trial.params[LR]
        evals_to_goal = -(-195 // (1000 * lr))  # ceil
        expected = min(evals_to_goal * STEPS_PER_EVAL, BUDGET)  # never: the budget
        assert trial.value == pytest.approx(expected), (lr, trial.value)
    assert finish(study, tuning, base, tmp_path, tuner) == 0
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert best["policy"]["learn"]["learning_rate"] == study.best_trial.params[LR]
    assert "tune" not in best and best["env"]["stop_value"] == 195
    assert (tmp_path / "history.png").is_file()


def test_a_trial_behind_the_others_is_pruned_and_its_job_stopped_at_once(tmp_path):
    jobs = Jobs()
    _, _, study, tuner = tune(tmp_path, jobs, pruner="median", n_parallel=2, n_trials=12)
    tuner.run(deadline=float("inf"))
    pruned = [t for t in study.get_trials() if t.state == trial_state("PRUNED")]
    assert pruned, [(t.params, t.state) for t in study.get_trials()]
    for trial in pruned:
        job_id = trial.user_attrs["job_id"]
        assert job_id in jobs.stopped
        assert len(jobs.jobs[job_id]["evals"]) * STEPS_PER_EVAL < BUDGET  # stopped early


def test_a_tune_cut_short_goes_on_from_its_storage(tmp_path):
    jobs = Jobs()
    tuning, base, study, tuner = tune(tmp_path, jobs, pruner="none", n_trials=4)
    tuner._start()  # a trial and its job, then the tune dies
    (left,) = tuner.running
    again_jobs = jobs  # the same coordinator
    _, _, study, again = tune(tmp_path, again_jobs, pruner="none", n_trials=4)
    again.run(deadline=float("inf"))
    states = [t.state for t in study.get_trials()]
    assert states.count(trial_state("FAIL")) == 1 and states.count(trial_state("COMPLETE")) == 4
    assert left in jobs.stopped  # the cut-short trial's job


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
        ({"storage": "study.db"}, "tune.storage", "storage URL"),
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
