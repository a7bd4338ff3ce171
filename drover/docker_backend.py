"""`drover run CONFIG --backend docker`: the roles as containers of the drover image,
on one network and one volume, through the Docker SDK; torn down at the end.

The containers are the compose services (docker-compose.yml): the same image,
commands, variables and shared-memory size; `tests/deploy/test_docker_backend.py`
holds them to it. The coordinator's port is published on 127.0.0.1 only, the job is
submitted and watched through it, and the volume (the shared root, with the job's
policies, checkpoints and summary) is kept and named at the end.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common.messages import JobStatus
from services.coordinator.client import CoordinatorClient

#: Each call to the engine: creating a container can take tens of seconds on an engine
#: whose storage driver copies the image (vfs).
ENGINE_TIMEOUT_S = 300
DEFAULT_IMAGE = "drover:latest"
#: The coordinator's own image (the Dockerfile's `coordinator` target): no torch.
DEFAULT_COORDINATOR_IMAGE = "drover-coordinator:latest"
COORDINATOR_PORT = 8000
#: The ports the coordinator's buffer processes take (one a running job).
BUFFER_PORTS = "8300-8399"
#: How long the coordinator may stop answering mid-job (a restart) before the run fails.
COORDINATOR_OUTAGE_S = 120.0
SHARED = "/shared"


class DockerUnavailable(RuntimeError):
    """No Docker engine answers, or the image is not there: the message says which."""


@dataclass(frozen=True)
class ContainerSpec:
    """One container: what `docker run` is given."""

    role: str
    name: str
    image: str
    command: list[str]
    environment: dict[str, str]
    #: Container port -> published on 127.0.0.1 (a free host port).
    published: list[int] = field(default_factory=list)
    shm_size: str | None = None
    #: A process that dies is started again in its container (compose's `restart`);
    #: the engine leaves one that an operator stopped or `docker kill`ed stopped.
    restart: str = "unless-stopped"


def container_specs(
    run_id: str,
    *,
    collectors: int,
    learner_ranks: int,
    token: str,
    registration_token: str,
    metrics_token: str,
    image: str = DEFAULT_IMAGE,
    coordinator_image: str = DEFAULT_COORDINATOR_IMAGE,
) -> list[ContainerSpec]:
    """The containers of one run: a coordinator, `collectors` collectors and a learner
    (a group of `learner_ranks` ranks), as docker-compose.yml defines them."""
    common = {
        "DROVER_SHARED_DIR": SHARED,
        "DROVER_HOST": "0.0.0.0",
        "DROVER_COORDINATOR_URL": f"http://coordinator:{COORDINATOR_PORT}",
        # May read /metrics and nothing else (a Prometheus scraping the containers).
        "DROVER_METRICS_TOKEN": metrics_token,
    }
    workers = {**common, "DROVER_REGISTRATION_TOKEN": registration_token}
    specs = [
        ContainerSpec(
            role="coordinator",
            name=f"{run_id}-coordinator",
            image=coordinator_image,
            command=["coordinator"],
            environment={
                **common,
                "DROVER_PORT": str(COORDINATOR_PORT),
                "DROVER_TOKEN": token,
                "DROVER_REGISTRATION_TOKEN": registration_token,
                # Each job's buffer process, in this container: workers reach it here.
                "DROVER_BUFFER_ADVERTISE_HOST": "coordinator",
                "DROVER_BUFFER_PORTS": BUFFER_PORTS,
            },
            published=[COORDINATOR_PORT],
        )
    ]
    specs += [
        ContainerSpec(
            role="collector",
            name=f"{run_id}-collector-{i}",
            image=image,
            command=["collector"],
            environment={**workers, "DROVER_PORT": "8100"},
        )
        for i in range(collectors)
    ]
    specs.append(
        ContainerSpec(
            role="learner",
            name=f"{run_id}-learner",
            image=image,
            command=["learner", "--nproc", str(learner_ranks)],
            environment={**workers, "DROVER_PORT": "8200"},
            shm_size="1gb",
        )
    )
    return specs


class DockerRun:
    """One run's network, volume and containers. Usage::

    with DockerRun(docker.from_env(timeout=ENGINE_TIMEOUT_S), specs, run_id) as run:
        client = run.coordinator_client(token)
    """

    def __init__(self, engine: Any, specs: list[ContainerSpec], run_id: str) -> None:
        self.engine = engine
        self.specs = specs
        self.run_id = run_id
        self.volume_name = f"{run_id}-shared"
        self._network: Any = None
        self._containers: list[Any] = []

    def __enter__(self) -> DockerRun:
        for spec in self.specs:
            try:
                self.engine.images.get(spec.image)
            except Exception as exc:  # docker.errors.ImageNotFound, APIError
                target = " --target coordinator" if spec.role == "coordinator" else ""
                raise DockerUnavailable(
                    f"image {spec.image} not found ({exc}); build it: docker build{target} "
                    f"-t {spec.image} -f deploy/docker/Dockerfile ."
                ) from exc
        self._network = self.engine.networks.create(self.run_id, driver="bridge")
        self.engine.volumes.create(self.volume_name)
        try:
            for spec in self.specs:
                self._containers.append(self._start(spec))
        except Exception:
            self.__exit__()
            raise
        return self

    def _start(self, spec: ContainerSpec) -> Any:
        container = self.engine.containers.create(
            spec.image,
            command=spec.command,
            name=spec.name,
            environment=spec.environment,
            volumes={self.volume_name: {"bind": SHARED, "mode": "rw"}},
            ports={f"{port}/tcp": ("127.0.0.1", None) for port in spec.published},
            shm_size=spec.shm_size,
            restart_policy={"Name": spec.restart},
            labels={"drover.run": self.run_id, "drover.role": spec.role},
            # Created on the run's network, reachable by its role's name as under
            # compose (http://coordinator:8000). Connected after its creation instead,
            # it would also keep the engine's default network, which may be `none`
            # (an engine without a default bridge), and then it resolves no name.
            network=self.run_id,
            networking_config={
                self.run_id: self.engine.api.create_endpoint_config(aliases=[spec.role])
            },
        )
        container.start()
        return container

    def coordinator_url(self) -> str:
        coordinator = self._containers[0]
        coordinator.reload()
        binding = coordinator.ports[f"{COORDINATOR_PORT}/tcp"][0]
        return f"http://127.0.0.1:{binding['HostPort']}"

    def __exit__(self, *exc: object) -> None:
        for container in reversed(self._containers):  # slaves first: they leave
            try:
                container.stop(timeout=10)
                container.remove()
            except Exception:  # noqa: BLE001, S112 - tear down all that can be
                continue
        self._containers = []
        if self._network is not None:
            self._network.remove()
            self._network = None


def run_in_docker(
    raw: dict[str, Any],
    name: str,
    *,
    collectors: int,
    learner_ranks: int,
    timeout_s: float,
    say: Callable[[str], None],
    image: str = DEFAULT_IMAGE,
    engine: Any = None,
) -> JobStatus:
    """Train one job on containers; returns its last status.

    Raises:
        DockerUnavailable: no engine, or no image.
        TimeoutError: the job did not end within `timeout_s`.
    """
    if engine is None:
        import docker  # here: the local backend never needs it

        try:
            engine = docker.from_env(timeout=ENGINE_TIMEOUT_S)
            engine.ping()
        except Exception as exc:  # docker.errors.DockerException
            raise DockerUnavailable(f"cannot reach a Docker engine: {exc}") from exc
    run_id = f"drover-{secrets.token_hex(4)}"
    token = secrets.token_urlsafe(32)
    specs = container_specs(
        run_id,
        collectors=collectors,
        learner_ranks=learner_ranks,
        token=token,
        registration_token=secrets.token_urlsafe(32),
        metrics_token=secrets.token_urlsafe(32),
        image=image,
    )
    with DockerRun(engine, specs, run_id) as run:
        say(f"containers {', '.join(s.name for s in specs)} on network {run_id}")
        client = CoordinatorClient(run.coordinator_url(), token, timeout_s=10.0)
        deadline = time.monotonic() + timeout_s
        while True:  # the coordinator starts
            try:
                job_id = client.submit_job(raw, name=name).job_id
                break
            except Exception:  # noqa: BLE001 - not answering yet
                if time.monotonic() > deadline:
                    raise TimeoutError("the coordinator container did not answer") from None
                time.sleep(1.0)
        say(f"job {job_id} submitted")
        try:
            # The coordinator's container restarts if its process dies: waited out.
            status = client.wait_for_end(
                job_id,
                outage_s=COORDINATOR_OUTAGE_S,
                poll_s=5.0,
                deadline=deadline,
                on_status=lambda s: say(f"{s.phase}: {s.env_steps} env steps, v{s.policy_version}"),
            )
        except TimeoutError:
            client.stop_job(job_id)
            raise TimeoutError(f"job {job_id} did not end within {timeout_s}s") from None
        say(f"results are in the volume {run.volume_name} (docker volume rm {run.volume_name})")
        return status
