"""Typed client for the coordinator's `/api/v1` routes.

Mirrors `services/coordinator/api/*` (a job's data calls are services/buffer/client.py's,
to its buffer processes): a route change and its client change land in one diff. Every
call has a timeout (ServiceClient).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from common.http_client import API, ServiceClient, ServiceUnavailable
from common.messages import (
    TERMINAL_PHASES,
    CheckpointList,
    ExperimentCreated,
    ExperimentList,
    ExperimentStatus,
    ExperimentSubmit,
    ExperimentSummary,
    GameResult,
    GameResults,
    Heartbeat,
    HeartbeatReply,
    JobCreated,
    JobList,
    JobStatus,
    JobSubmit,
    LeagueView,
    Match,
    MatchDraw,
    MatchList,
    PolicyAnnounce,
    PolicyRef,
    Registered,
    TaskComplete,
    TaskFail,
    TaskProgress,
    WorkerInfo,
    WorkerRegistration,
    parse,
)


class CoordinatorClient(ServiceClient):
    """Args (besides ServiceClient's): `registration_token`, a secret that may only
    register; when given, registering uses it instead of the cluster token."""

    def __init__(self, base_url: str, token: str, *, registration_token: str = "", **kw: Any):
        super().__init__(base_url, token, **kw)
        self._registration_token = registration_token

    # --- users --------------------------------------------------------------------

    def submit_job(self, config: dict[str, Any], name: str | None = None) -> JobCreated:
        return self.call_as(JobCreated, "POST", f"{API}/jobs", JobSubmit(config=config, name=name))

    def list_jobs(self, phase: str | None = None) -> list[JobStatus]:
        """Every job the coordinator holds (of `phase`), newest first, page by page."""
        jobs: list[JobStatus] = []
        page = self.jobs_page(phase=phase)
        jobs.extend(page.jobs)
        while page.next_page_token is not None:
            page = self.jobs_page(phase=phase, page_token=page.next_page_token)
            jobs.extend(page.jobs)
        return jobs

    def jobs_page(
        self, *, phase: str | None = None, limit: int | None = None, page_token: str | None = None
    ) -> JobList:
        """One page of jobs, newest first; `page_token` continues a previous page."""
        params = {"phase": phase, "limit": limit, "page_token": page_token}
        query = {k: v for k, v in params.items() if v is not None}
        return parse(JobList, self.call("GET", f"{API}/jobs", params=query or None))

    def job(self, job_id: str, *, wait_s: float = 0.0) -> JobStatus:
        """The job's status; with `wait_s`, once it has ended or `wait_s` have passed."""
        if wait_s <= 0:
            return self.call_as(JobStatus, "GET", f"{API}/jobs/{job_id}")
        return self.call_as(
            JobStatus,
            "GET",
            f"{API}/jobs/{job_id}?wait_s={round(wait_s, 3)}",
            timeout_s=self.timeout_s + wait_s,
        )

    def wait_for_end(
        self,
        job_id: str,
        *,
        outage_s: float,
        poll_s: float = 2.0,
        deadline: float | None = None,
        on_status: Callable[[JobStatus], None] | None = None,
    ) -> JobStatus:
        """The job's status once it is in a terminal phase, polled every `poll_s`.

        A coordinator that stops answering may be restarting (its state is durable),
        so that is waited out for up to `outage_s` seconds at a time.

        Raises:
            ServiceUnavailable: the coordinator did not answer for `outage_s`.
            TimeoutError: `deadline` (a time.monotonic() value) passed first.
        """
        answered = time.monotonic()
        while True:
            try:
                status = self.job(job_id)
                answered = time.monotonic()
            except ServiceUnavailable:
                if time.monotonic() - answered > outage_s:
                    raise
                status = None
            if status is not None and status.phase in TERMINAL_PHASES:
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} did not end in time")
            if status is not None and on_status is not None:
                on_status(status)
            time.sleep(poll_s)

    def stop_job(self, job_id: str) -> None:
        self.call("DELETE", f"{API}/jobs/{job_id}")

    def submit_experiment(
        self, config: dict[str, Any], name: str | None = None
    ) -> ExperimentCreated:
        """Submit a config with a `sweep:` section: its jobs, every one checked first."""
        body = ExperimentSubmit(config=config, name=name)
        return self.call_as(ExperimentCreated, "POST", f"{API}/experiments", body)

    def experiment(self, experiment_id: str) -> ExperimentStatus:
        return self.call_as(ExperimentStatus, "GET", f"{API}/experiments/{experiment_id}")

    def experiments(self) -> list[ExperimentSummary]:
        """Every experiment, newest first (page after page)."""
        found: list[ExperimentSummary] = []
        token: str | None = None
        while True:
            query = None if token is None else {"page_token": token}
            page = parse(ExperimentList, self.call("GET", f"{API}/experiments", params=query))
            found += page.experiments
            token = page.next_page_token
            if token is None:
                return found

    def stop_experiment(self, experiment_id: str) -> ExperimentStatus:
        return self.call_as(ExperimentStatus, "DELETE", f"{API}/experiments/{experiment_id}")

    def metrics(self, job_id: str) -> dict[str, Any]:
        return self.call("GET", f"{API}/jobs/{job_id}/metrics")

    def buffer_stats(self, job_id: str) -> dict[str, Any]:
        return self.call("GET", f"{API}/jobs/{job_id}/buffer")

    def workers(self) -> list[WorkerInfo]:
        return [parse(WorkerInfo, w) for w in self.call("GET", f"{API}/workers")["workers"]]

    def policy_bytes(self, job_id: str, version: int | None = None) -> bytes:
        params = {"version": version} if version is not None else None
        return self.raw("GET", f"{API}/jobs/{job_id}/policy", params=params).data

    def checkpoints(self, job_id: str) -> list[str]:
        """The job's checkpoint file names, oldest first."""
        return self.call_as(CheckpointList, "GET", f"{API}/jobs/{job_id}/checkpoints").names

    def checkpoint_bytes(self, job_id: str, name: str) -> bytes:
        return self.raw("GET", f"{API}/jobs/{job_id}/checkpoints/{name}").data

    # --- workers ------------------------------------------------------------------

    def register(
        self, role: str, url: str, resources: dict[str, Any], *, slave_token: str
    ) -> Registered:
        reg = WorkerRegistration(
            role=role,  # type: ignore[arg-type]
            url=url,
            slave_token=slave_token,
            resources=resources,
        )
        # Registering takes the registration secret (or the cluster token); the
        # answer's credential is used after.
        auth = self._registration_token or self._token
        return self.call_as(Registered, "POST", f"{API}/workers", reg, auth=auth)

    def heartbeat(self, worker_id: str, tasks: list[TaskProgress]) -> HeartbeatReply:
        path = f"{API}/workers/{worker_id}/heartbeat"
        return self.call_as(HeartbeatReply, "POST", path, Heartbeat(tasks=tasks))

    def leave(self, worker_id: str) -> None:
        self.call("DELETE", f"{API}/workers/{worker_id}", timeout_s=2.0)

    def complete_task(self, task_id: str, result: dict[str, Any]) -> None:
        self.call("POST", f"{API}/tasks/{task_id}/complete", TaskComplete(result=result))

    def fail_task(self, task_id: str, error: str) -> None:
        self.call("POST", f"{API}/tasks/{task_id}/fail", TaskFail(error=error[:4096]))

    # --- self-play leagues ---------------------------------------------------------

    def league(self, job_id: str) -> LeagueView:
        return self.call_as(LeagueView, "GET", f"{API}/jobs/{job_id}/league")

    def draw_matches(self, job_id: str, task_id: str, count: int) -> list[Match]:
        reply = self.call_as(
            MatchList,
            "POST",
            f"{API}/jobs/{job_id}/league/matches",
            MatchDraw(task_id=task_id, count=count),
        )
        return reply.matches

    def report_games(self, job_id: str, task_id: str, results: list[GameResult]) -> None:
        self.call(
            "POST",
            f"{API}/jobs/{job_id}/league/results",
            GameResults(task_id=task_id, results=results),
        )

    def announce_policy(self, job_id: str, ref: PolicyRef, *, task_id: str | None = None) -> None:
        announce = PolicyAnnounce(
            version=ref.version,
            path=ref.path,
            sha256=ref.sha256,
            train_iter=ref.train_iter,
            task_id=task_id,
            epoch=ref.epoch,
        )
        self.call("POST", f"{API}/jobs/{job_id}/policies", announce)

    def latest_policy(
        self, job_id: str, *, newer_than: int | None = None, timeout_s: float = 0.0
    ) -> PolicyRef | None:
        """The newest version; with `newer_than`, waits up to `timeout_s` for a newer one."""
        params = None
        if newer_than is not None:
            params = {"newer_than": newer_than, "timeout_s": round(timeout_s, 3)}
        data = self.call(
            "GET",
            f"{API}/jobs/{job_id}/policies/latest",
            params=params,
            timeout_s=self.timeout_s + timeout_s,
        )
        return parse(PolicyRef, data) if data else None
