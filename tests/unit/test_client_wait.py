"""`CoordinatorClient.wait_for_end`: what `drover submit --wait` and the docker backend
watch a job with, through a coordinator restart."""

from __future__ import annotations

import pytest

from common.http_client import ServiceUnavailable
from common.messages import JobStatus
from services.coordinator.client import CoordinatorClient


def status(phase: str, env_steps: int = 0) -> JobStatus:
    return JobStatus(
        job_id="job-1",
        name="j",
        phase=phase,  # type: ignore[arg-type]
        algo="dqn",
        env_id="CartPole-v1",
        env_steps=env_steps,
        train_iters=0,
        policy_version=0,
        last_eval=None,
        best_eval_return=None,
        best_policy_version=None,
        stop_value=None,
        reason="",
        started_at=0.0,
        finished_at=None,
    )


class ScriptedClient(CoordinatorClient):
    """Answers `job` from a script: a status, or an exception to raise."""

    def __init__(self, script: list[JobStatus | Exception]) -> None:
        super().__init__("http://127.0.0.1:9", "t")
        self.script = script

    def job(self, job_id: str) -> JobStatus:
        answer = self.script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_a_restart_mid_job_is_waited_out():
    down = ServiceUnavailable("connection reset")
    client = ScriptedClient([status("running", 10), down, down, status("succeeded", 99)])
    seen: list[int] = []
    final = client.wait_for_end(
        "job-1", outage_s=60, poll_s=0, on_status=lambda s: seen.append(s.env_steps)
    )
    assert final.phase == "succeeded" and seen == [10]


def test_a_coordinator_gone_longer_than_the_outage_bound_is_an_error():
    client = ScriptedClient([status("running")] + [ServiceUnavailable("refused")] * 1000)
    with pytest.raises(ServiceUnavailable):
        client.wait_for_end("job-1", outage_s=0.05, poll_s=0.01)


def test_the_deadline_bounds_a_job_that_never_ends():
    client = ScriptedClient([status("running")] * 1000)
    with pytest.raises(TimeoutError):
        client.wait_for_end("job-1", outage_s=60, poll_s=0.01, deadline=0.0)
