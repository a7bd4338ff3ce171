"""Workflows are looked up by name and checked before anything starts; adding one is
a class and a line in WORKFLOWS, with no change to the coordinator."""

import pytest

from common.config import ConfigError
from common.messages import CollectSpec
from jobconfig import resolve_job_config
from services.coordinator.workflows import WORKFLOWS, check_workflow
from services.coordinator.workflows.training import AsyncTraining
from tests.coordinator_app import (
    CONFIG,
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
            "ppo runs evaluate or sync",
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
