"""drover from Python: `from drover import Client`, what a notebook or a script imports.

    from drover import Client

    client = Client()                          # DROVER_COORDINATOR_URL, DROVER_TOKEN
    job = client.submit("examples/cartpole_dqn.yaml")       # a file, or a dict
    status = client.wait(job.job_id, progress=True)         # a bar on stderr
    for summary in client.evaluations(job.job_id):          # what came so far
        print(summary.env_steps, summary.return_mean)
    client.download(job.job_id, "results/")     # best policy, checkpoints, summary

Every call has a timeout; what the coordinator refuses raises `ApiError` with the
message `drover` prints (`.message`, `.status`), and a coordinator that cannot be
reached raises `ServiceUnavailable`. Results are the services' own typed messages
(`common.messages`: `JobStatus`, `EvalSummary`, `WorkerInfo`, ...). The client needs
neither torch nor the services' packages: `pip install drover` is enough.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from common.errors import ApiError
from common.http_client import ServiceUnavailable
from common.messages import (
    TERMINAL_PHASES,
    EvalSummary,
    JobCreated,
    JobStatus,
    LeagueView,
    WorkerInfo,
    dump_json,
    parse,
)
from common.settings import SettingsError, coordinator_url, read_token
from common.storage import checkpoint_key
from services.coordinator.client import CoordinatorClient

__all__ = ["ApiError", "Client", "ServiceUnavailable"]


class Client:
    """A drover coordinator's API for a user (the module's docstring).

    Args:
        url: the coordinator (default: `DROVER_COORDINATOR_URL`, else
            http://127.0.0.1:8000).
        token: the cluster's API token (default: `DROVER_TOKEN` or the file
            `DROVER_TOKEN_FILE` names).
        timeout_s: each call's timeout.
    """

    def __init__(
        self, url: str | None = None, token: str | None = None, *, timeout_s: float = 10.0
    ) -> None:
        self.url = (url or coordinator_url()).rstrip("/")
        if token is None:
            try:
                token = read_token()
            except SettingsError as exc:
                raise ValueError(f"no token: pass token= or {exc}") from None
        self._api = CoordinatorClient(self.url, token, timeout_s=timeout_s)

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # --- jobs ---------------------------------------------------------------------------

    def submit(
        self,
        config: dict[str, Any] | str | Path,
        *,
        name: str | None = None,
        allow_unknown_keys: bool = False,
    ) -> JobCreated:
        """Submit a job: a config dict, or a config file (YAML, JSON, or a DI-engine
        `.py` file, read here as `drover run` reads it). An unknown key is refused
        (`ApiError` naming it) unless `allow_unknown_keys`."""
        if isinstance(config, str | Path):
            from jobconfig.files import load_config

            config, _ = load_config(config, allow_unknown_keys=allow_unknown_keys)
        elif allow_unknown_keys:
            config = {**config, "strict": False}
        return self._api.submit_job(config, name=name or config.get("exp_name"))

    def job(self, job_id: str) -> JobStatus:
        return self._api.job(job_id)

    def jobs(self, phase: str | None = None) -> list[JobStatus]:
        """Every job the coordinator keeps (of `phase`), newest first."""
        return self._api.list_jobs(phase)

    def stop(self, job_id: str) -> JobStatus:
        """Stop a job; its status (its end is written as it stops)."""
        self._api.stop_job(job_id)
        return self._api.job(job_id)

    def wait(
        self,
        job_id: str,
        *,
        timeout_s: float | None = None,
        progress: bool = False,
        callback: Callable[[JobStatus], None] | None = None,
        poll_s: float = 2.0,
    ) -> JobStatus:
        """The job's status once it has ended. `progress`: a bar of its env steps on
        stderr; `callback`: called with each status seen while it runs. A coordinator
        that stops answering (restarting) is waited out up to a minute at a time.

        Raises:
            TimeoutError: `timeout_s` passed first (the job goes on).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if not progress:
            return self._api.wait_for_end(
                job_id, outage_s=60.0, poll_s=poll_s, deadline=deadline, on_status=callback
            )
        from rich.progress import Progress

        with Progress(transient=False, console=_stderr()) as bar:
            task = bar.add_task(job_id, total=None)

            def show(status: JobStatus) -> None:
                last = status.last_eval.return_mean if status.last_eval else None
                shown = "" if last is None else f" · eval {last:.1f}"
                bar.update(
                    task,
                    completed=status.env_steps,
                    total=status.max_env_step,
                    description=f"{job_id} {status.phase}{shown}",
                )
                if callback is not None:
                    callback(status)

            status = self._api.wait_for_end(
                job_id, outage_s=60.0, poll_s=poll_s, deadline=deadline, on_status=show
            )
            show(status)
            return status

    def evaluations(
        self, job_id: str, *, follow: bool = False, poll_s: float = 2.0
    ) -> Iterator[EvalSummary]:
        """The job's evaluations, oldest first; `follow`: and each new one as it comes,
        until the job ends."""
        seen = 0
        while True:
            # The phase first: an evaluation that came with the end is in what follows.
            ended = follow and self._api.job(job_id).phase in TERMINAL_PHASES
            evals = sorted(
                (parse(EvalSummary, e) for e in self.metrics(job_id)["evals"]),
                key=lambda e: e.env_steps,
            )
            yield from evals[seen:]
            seen = len(evals)
            if not follow or ended:
                return
            time.sleep(poll_s)

    def metrics(self, job_id: str) -> dict[str, Any]:
        """The job's time series (`points`), evaluations (`evals`) and buffer."""
        return self._api.metrics(job_id)

    def league(self, job_id: str) -> LeagueView:
        """A self-play job's league: its players and their ratings."""
        return self._api.league(job_id)

    # --- the cluster ----------------------------------------------------------------------

    def workers(self) -> list[WorkerInfo]:
        return self._api.workers()

    # --- artifacts --------------------------------------------------------------------------

    def download(self, job_id: str, folder: str | Path, *, checkpoints: bool = True) -> Path:
        """The job's artifacts to `folder`/<job_id>: its best policy (else its newest),
        its newest checkpoint, and its status as `summary.json`; returns that folder."""
        out = Path(folder) / job_id
        out.mkdir(parents=True, exist_ok=True)
        status = self._api.job(job_id)
        version = status.best_policy_version or status.policy_version
        if version:
            name = "best" if status.best_policy_version else "latest"
            data = self._api.policy_bytes(job_id, version)
            (out / f"{name}-{version:08d}.safetensors").write_bytes(data)
        if checkpoints:
            # Only a checkpoint's name becomes a file name here (not a path the answer
            # could lead elsewhere with).
            names = [n for n in self._api.checkpoints(job_id) if checkpoint_key(n) is not None]
            if names:
                (out / names[-1]).write_bytes(self._api.checkpoint_bytes(job_id, names[-1]))
        (out / "summary.json").write_bytes(dump_json(status))
        return out


def _stderr() -> Any:
    from rich.console import Console

    return Console(file=sys.stderr)
