"""Workflows are looked up by name and checked before anything starts; adding one is
a class and a line in WORKFLOWS, with no change to the coordinator."""

from dataclasses import dataclass

import pytest

from common.config import ConfigError
from common.env_guard import ENV_MODULES_VAR
from common.games import TICTACTOE
from common.messages import CollectSpec
from common.storage import SharedStore
from jobconfig import resolve_job_config
from services.coordinator.core import CoordinatorLimits
from services.coordinator.workflows import WORKFLOWS, check_workflow
from services.coordinator.workflows.base import Outcome
from services.coordinator.workflows.training import AsyncTraining
from tests.buffer_hosts import make_coordinator
from tests.coordinator_app import (
    AUTH,
    CONFIG,
    get,
    post,
    register,
    submit,
)


def checked(raw):
    config, _ = resolve_job_config(raw)
    return check_workflow(config)


@pytest.mark.parametrize(
    ("raw", "field", "says"),
    [
        ({"system": {"workflow": "sometimes"}}, "system.workflow", "known: async, evaluate"),
        (
            {"policy": {"type": "ppo"}, "system": {"workflow": "async"}},
            "system.workflow",
            "ppo runs evaluate or selfplay or sync",
        ),
        (
            {"policy": {"type": "dqn"}, "system": {"workflow": "sync"}},
            "system.workflow",
            "dqn runs async or evaluate",
        ),
        (
            {"policy": {"type": "ppo", "other": {"replay_buffer": {"type": "uniform"}}}},
            "policy.other.replay_buffer",
            "fifo",
        ),
        (
            {"system": {"workflow": "evaluate", "evaluate": {"source": "policy"}}},
            "system.evaluate.path",
            "needs a path",
        ),
    ],
)
def test_a_workflow_refuses_what_it_cannot_run_naming_the_field(raw, field, says):
    with pytest.raises(ConfigError) as err:
        checked(raw)
    assert err.value.field == field and says in err.value.message


GO = "pettingzoo.classic.go_v5"  # a two-player game with no heuristic's rules


def selfplay(league=None, env_id=TICTACTOE, workflow="selfplay"):
    return {
        "env": {"adapter": "pettingzoo", "env_id": env_id},
        "policy": {"type": "ppo", "other": {"league": league or {}}},
        "system": {"workflow": workflow},
    }


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (selfplay(env_id=GO), "policy.other.league.baselines.1"),  # random, heuristic
        (selfplay({"baselines": ["heuristic"]}, GO), "policy.other.league.baselines.0"),
        (
            selfplay({"baselines": ["random"], "eval_vs": ["random", "heuristic"]}, GO),
            "policy.other.league.eval_vs.1",
        ),
        (
            selfplay({"baselines": ["random"], "stop": {"vs": "heuristic"}}, GO),
            "policy.other.league.stop.vs",
        ),
        (selfplay(env_id="os"), "env.env_id"),  # the game's own refusal comes first
        (selfplay(workflow="sync"), "env.adapter"),
        (selfplay(workflow="evaluate"), "env.adapter"),
    ],
)
def test_selfplay_refuses_a_baseline_without_rules_for_the_game_and_only_it_plays_games(
    raw, field, monkeypatch
):
    monkeypatch.setenv(ENV_MODULES_VAR, GO)  # the operator allows go
    with pytest.raises(ConfigError) as err:
        checked(raw)
    assert err.value.field == field, err.value
    assert checked(selfplay({"baselines": ["random"]}, GO)) is WORKFLOWS["selfplay"]
    assert checked(selfplay({"eval_vs": ["heuristic"]})) is WORKFLOWS["selfplay"]


def test_a_submitted_job_with_a_baseline_the_game_lacks_is_refused_naming_it(client, monkeypatch):
    monkeypatch.setenv(ENV_MODULES_VAR, GO)
    for raw, field in [
        (
            selfplay({"baselines": ["random"], "eval_vs": ["heuristic"]}, GO),
            "config.policy.other.league.eval_vs.0",
        ),
        (selfplay(workflow="sync"), "config.env.adapter"),
    ]:
        resp = post(client, "/api/v1/jobs", {"config": raw})
        assert resp.status_code == 400, resp.json
        assert resp.json["message"].startswith(f"{field}: "), resp.json
    assert client.get("/api/v1/jobs", headers=AUTH).json["jobs"] == []


def test_every_algorithms_default_workflow_takes_its_default_config():
    for algo in ("dqn", "ppo", "impala", "sac"):
        assert checked({"policy": {"type": algo}}) is not None


class CollectOnly(AsyncTraining):
    """Collect without training: a workflow in a dozen lines."""

    def plan(self, job, planner):
        free = planner.free_workers("collector", "collect")
        return [
            planner.assign(job, w, CollectSpec(seed=planner.seed(job), num_envs=1)) for w in free
        ]


def test_a_workflow_added_to_the_registry_runs_with_no_other_change(client, core, monkeypatch):
    monkeypatch.setitem(WORKFLOWS, "collect_only", CollectOnly())
    job_id = submit(client, {**CONFIG, "system": {"workflow": "collect_only"}})
    register(client, "collector", "http://127.0.0.1:8101")
    register(client, "learner", "http://127.0.0.1:8201")
    plan = core.plan()
    assert [d.task.kind for d in plan if d.task] == ["collect"]
    assert {d.task.job_id for d in plan} == {job_id}
    # the name is checked at submission: without the registry line it is refused
    monkeypatch.delitem(WORKFLOWS, "collect_only")
    refused = post(
        client, "/api/v1/jobs", {"config": {**CONFIG, "system": {"workflow": "collect_only"}}}
    )
    assert refused.status_code == 400
    assert refused.json["message"].startswith("config.system.workflow")


@dataclass
class Passes:
    planned: int = 0


class PlannedThrice(AsyncTraining):
    """A workflow with state of its own (the passes that planned its job), done after
    three: the state is its value, which it creates, records and restores."""

    def new_state(self, config):
        return Passes()

    def record(self, state):
        return {"planned": state.planned}

    def restore(self, record, config):
        return Passes(planned=int(record.get("planned", 0)))

    def plan(self, job, planner):
        job.workflow_state.planned += 1
        return []

    def outcome(self, job):
        planned = job.workflow_state.planned
        return Outcome("succeeded", f"planned {planned} times") if planned >= 3 else None


def test_a_workflows_own_state_survives_a_restart_and_its_outcome_ends_the_job(
    tmp_path, client, core, monkeypatch
):
    monkeypatch.setitem(WORKFLOWS, "planned_thrice", PlannedThrice())
    job_id = submit(client, {**CONFIG, "system": {"workflow": "planned_thrice"}})
    core.plan()
    core.plan()
    assert core.jobs[job_id].workflow_state == Passes(planned=2)
    core.snapshot_jobs()

    again = make_coordinator(SharedStore(tmp_path), CoordinatorLimits(max_buffer_items=1000))
    again.restore_jobs()
    job = again.jobs[job_id]
    assert job.workflow_state == Passes(planned=2)  # restored by the workflow
    again.plan()  # the third
    assert job.phase == "running"
    again.plan()  # settled at the next pass: the workflow said why, the coordinator ended it
    assert (job.phase, job.reason) == ("succeeded", "planned 3 times")
    assert job.workflow_state is None  # an ended job lets go of it


def test_a_league_is_served_for_a_workflow_that_declares_one_only(client):
    # `Workflow.has_league`: the route asks the job's workflow, not its name.
    job_id = submit(client)  # the async DQN example: no league
    answer = get(client, f"/api/v1/jobs/{job_id}/league")
    assert answer.status_code == 404 and "keeps none" in answer.json["message"]
    assert not WORKFLOWS["async"].has_league and WORKFLOWS["selfplay"].has_league
