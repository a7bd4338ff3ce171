"""`drover run --backend docker`: the containers it runs are docker-compose.yml's
services (so the two cannot drift), it wires and tears them down through the Docker
SDK, and without an engine it says so. Against a real engine it trains the example
(skipped here: this machine has only the docker client)."""

from pathlib import Path

import pytest
import yaml

from drover import cli
from drover.docker_backend import ContainerSpec, DockerRun, container_specs

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
SECRETS = ("DROVER_TOKEN", "DROVER_REGISTRATION_TOKEN", "DROVER_METRICS_TOKEN")


def engine_reachable() -> bool:
    try:
        import docker

        docker.from_env(timeout=5).ping()
        return True
    except Exception:  # noqa: BLE001 - any failure means no engine
        return False


@pytest.mark.parametrize("ranks", [1, 2])
def test_the_containers_are_the_compose_services(ranks):
    specs = container_specs(
        "drover-test",
        collectors=3,
        learner_ranks=ranks,
        token="t" * 32,
        registration_token="r" * 32,
        metrics_token="m" * 32,
    )
    assert [s.role for s in specs] == [
        "coordinator",
        "collector",
        "collector",
        "collector",
        "learner",
    ]
    for spec in specs:
        service = COMPOSE[spec.role]
        command = [c.replace("${DROVER_LEARNER_RANKS:-1}", str(ranks)) for c in service["command"]]
        assert spec.command == command, spec.role
        assert spec.image == service["image"]
        compose_env = service["environment"]
        assert spec.environment.keys() == compose_env.keys(), spec.role
        for name, value in compose_env.items():
            if name not in SECRETS:
                assert spec.environment[name] == value, (spec.role, name)
        assert spec.shm_size == service.get("shm_size"), spec.role
        assert spec.restart == service["restart"], spec.role
        published = [int(p.split(":")[1]) for p in service.get("ports", [])]
        assert spec.published == published, spec.role
    assert {s.name for s in specs} == {s.name for s in specs if s.name.startswith("drover-test-")}
    # the workers get the registration secret, never the cluster token
    assert all("DROVER_TOKEN" not in s.environment for s in specs if s.role != "coordinator")


class FakeContainer:
    def __init__(self, engine, spec_kwargs):
        self.engine, self.kwargs = engine, spec_kwargs
        self.ports = {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "49153"}]}

    def start(self):
        self.engine.log.append(("start", self.kwargs["name"]))

    def reload(self):
        pass

    def stop(self, timeout):
        self.engine.log.append(("stop", self.kwargs["name"]))

    def remove(self):
        self.engine.log.append(("remove", self.kwargs["name"]))


class FakeNetwork:
    def __init__(self, engine, name):
        self.engine, self.name = engine, name

    def connect(self, container, aliases):
        self.engine.log.append(("connect", self.name, container.kwargs["name"], aliases))

    def disconnect(self, container):
        self.engine.log.append(("disconnect", self.name, container.kwargs["name"]))

    def remove(self):
        self.engine.log.append(("remove network", self.name))


class FakeEngine:
    """What DockerRun asks of the Docker SDK's client, recorded."""

    def __init__(self):
        self.log = []
        self.created = []
        engine = self

        class Images:
            def get(self, name):
                engine.log.append(("image", name))

        class Networks:
            def create(self, name, driver):
                engine.log.append(("network", name, driver))
                return FakeNetwork(engine, name)

            def get(self, name):
                return FakeNetwork(engine, name)

        class Volumes:
            def create(self, name):
                engine.log.append(("volume", name))

        class Containers:
            def create(self, image, **kwargs):
                container = FakeContainer(engine, {"image": image, **kwargs})
                engine.created.append(container)
                return container

        class Api:
            def create_endpoint_config(self, aliases):
                return {"Aliases": aliases}

        self.images, self.networks = Images(), Networks()
        self.volumes, self.containers = Volumes(), Containers()
        self.api = Api()


def test_a_run_is_one_network_and_one_volume_and_is_torn_down():
    specs = [
        ContainerSpec("coordinator", "r-coordinator", "drover:latest", ["coordinator"], {}, [8000]),
        ContainerSpec("collector", "r-collector-0", "drover:latest", ["collector"], {}),
    ]
    engine = FakeEngine()
    with DockerRun(engine, specs, "r") as run:
        assert run.coordinator_url() == "http://127.0.0.1:49153"
    coordinator, collector = engine.created
    assert coordinator.kwargs["ports"] == {"8000/tcp": ("127.0.0.1", None)}  # local only
    assert collector.kwargs["ports"] == {}
    for container in engine.created:
        assert container.kwargs["volumes"] == {"r-shared": {"bind": "/shared", "mode": "rw"}}
        assert container.kwargs["restart_policy"] == {"Name": "unless-stopped"}
    # each on the run's network from its creation, named by its role there
    for container, role in ((coordinator, "coordinator"), (collector, "collector")):
        assert container.kwargs["network"] == "r"
        assert container.kwargs["networking_config"] == {"r": {"Aliases": [role]}}
    assert ("volume", "r-shared") in engine.log
    ends = [entry for entry in engine.log if entry[0] in ("stop", "remove", "remove network")]
    assert ends == [
        ("stop", "r-collector-0"),
        ("remove", "r-collector-0"),
        ("stop", "r-coordinator"),
        ("remove", "r-coordinator"),
        ("remove network", "r"),
    ]  # slaves first; the volume (the results) is kept


@pytest.mark.skipif(engine_reachable(), reason="a Docker engine is reachable here")
def test_without_an_engine_drover_run_says_so(capsys):
    path = ROOT / "examples" / "cartpole_dqn.yaml"
    assert cli.main(["run", str(path), "--backend", "docker"]) == 2
    assert "--backend docker: cannot reach a Docker engine" in capsys.readouterr().err


@pytest.mark.processes
@pytest.mark.learning
@pytest.mark.skipif(
    not engine_reachable(), reason="no Docker engine on this machine (only the docker client)"
)
def test_the_example_trains_on_containers():
    path = ROOT / "examples" / "cartpole_dqn.yaml"
    assert cli.main(["run", str(path), "--backend", "docker", "--timeout-s", "600"]) == 0
