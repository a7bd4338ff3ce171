"""The Kubernetes manifests (deploy/k8s), checked offline: each overlay rendered with
`kubectl kustomize`, every object valid against the Kubernetes 1.30 and 1.37 schemas
in strict mode (kubernetes-validate), the sources yamllint-clean, and the objects
consistent with each other and with what the services read."""

import re
import shutil
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from yamllint import config as yamllint_config
from yamllint import linter

from services.coordinator.state import CoordinatorLimits
from tests.helpers import render

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ["cpu", "gpu"]
KUBERNETES_VERSIONS = ["1.30.0", "1.37.0"]
#: Created by the operator (`kubectl create secret`, as the base's header and the
#: README say), never shipped: the API token and the registration secret.
OPERATOR_SECRETS = {"drover-token": {"token", "registration", "metrics"}}
POD_KINDS = {"Deployment", "Job"}

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")


@pytest.fixture(scope="module", params=OVERLAYS)
def objects(request):
    return render(request.param)


def pod_specs(objects):
    for obj in objects:
        if obj["kind"] in POD_KINDS:
            yield obj, obj["spec"]["template"]


def containers(objects):
    for obj, template in pod_specs(objects):
        for container in template["spec"]["containers"]:
            yield obj, template, container


def env_of(container) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_is_valid_in_strict_mode(objects, version):
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_sources_are_yamllint_clean():
    rules = yamllint_config.YamlLintConfig(
        "extends: default\nrules:\n  line-length: {max: 100}\n  document-start: disable\n"
        "  truthy: {check-keys: false}\n"
    )
    problems = [
        f"{path.relative_to(ROOT)}:{problem.line}: {problem.message}"
        for path in sorted(K8S.rglob("*.yaml"))
        for problem in linter.run(path.read_text(), rules)
    ]
    assert problems == []


def test_the_shipped_job_is_the_default_example():
    shipped = (K8S / "base" / "cartpole_dqn.yaml").read_text()
    assert shipped == (ROOT / "examples" / "cartpole_dqn.yaml").read_text()


def test_selectors_match_their_pods_and_services_find_them(objects):
    for obj, template in pod_specs(objects):
        labels = template["metadata"]["labels"]
        if obj["kind"] == "Deployment":
            selector = obj["spec"]["selector"]["matchLabels"]
            assert selector.items() <= labels.items(), obj["metadata"]["name"]
    pods = [template["metadata"]["labels"] for _, template in pod_specs(objects)]
    for service in (o for o in objects if o["kind"] == "Service"):
        selector = service["spec"]["selector"]
        assert any(selector.items() <= labels.items() for labels in pods), service
    for policy in (o for o in objects if o["kind"] == "NetworkPolicy"):
        selector = policy["spec"]["podSelector"]["matchLabels"]
        assert all(selector.items() <= labels.items() for labels in pods)


def test_everything_referenced_exists(objects):
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    services = {name for kind, name in names if kind == "Service"}
    for _, template in pod_specs(objects):
        for volume in template["spec"].get("volumes", []):
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                assert ("PersistentVolumeClaim", claim) in names
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in names
            if "secret" in volume:
                secret = volume["secret"]
                keys = {item["key"] for item in secret.get("items", [])}
                assert keys <= OPERATOR_SECRETS[secret["secretName"]]
        for container in template["spec"]["containers"]:
            url = env_of(container).get("DROVER_COORDINATOR_URL")
            if url:
                host = re.match(r"http://([^:/]+)", url).group(1)
                assert host in services, url
    for hpa in (o for o in objects if o["kind"] == "HorizontalPodAutoscaler"):
        target = hpa["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) in names


def test_ports_are_the_ones_the_services_listen_on(objects):
    for obj, _, container in containers(objects):
        env = env_of(container)
        ports = [p["containerPort"] for p in container.get("ports", [])]
        if ports:
            assert ports == [int(env["DROVER_PORT"])], obj["metadata"]["name"]
        advertised = env.get("DROVER_ADVERTISE_URL")
        if advertised:
            # each slave advertises its own pod IP (downward API) and port
            assert advertised == f"http://$(POD_IP):{env['DROVER_PORT']}"
            (pod_ip,) = [e for e in container["env"] if e["name"] == "POD_IP"]
            assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def variables_the_services_read() -> set[str]:
    """Every DROVER_* name in the code, each secret's _FILE form, and the coordinator's
    limits (each settable as DROVER_<NAME>)."""
    names = set()
    for package in ("common", "services", "drover"):
        for path in (ROOT / package).rglob("*.py"):
            names |= set(re.findall(r"DROVER_[A-Z0-9_]+", path.read_text()))
    secrets = ("DROVER_TOKEN", "DROVER_REGISTRATION_TOKEN", "DROVER_METRICS_TOKEN")
    names |= {f"{name}_FILE" for name in secrets}
    names |= {f"DROVER_{name.upper()}" for name in CoordinatorLimits.__dataclass_fields__}
    return names


def test_every_drover_variable_set_is_one_the_services_read(objects):
    known = variables_the_services_read()
    for obj, _, container in containers(objects):
        unknown = {n for n in env_of(container) if n.startswith("DROVER_")} - known
        assert unknown == set(), (obj["metadata"]["name"], unknown)


def test_one_coordinator_replaced_by_stopping_the_old_one(objects):
    (coordinator,) = [
        o for o in objects if o["metadata"]["name"] == "coordinator" and o["kind"] == "Deployment"
    ]
    assert coordinator["spec"]["replicas"] == 1
    assert coordinator["spec"]["strategy"]["type"] == "Recreate"


def test_pods_run_locked_down_with_probes_and_resources(objects):
    for obj, template, container in containers(objects):
        name = obj["metadata"]["name"]
        assert template["spec"]["securityContext"]["runAsNonRoot"] is True, name
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True, name
        assert security["allowPrivilegeEscalation"] is False, name
        assert security["capabilities"]["drop"] == ["ALL"], name
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert "/tmp" in mounts, name  # scratch on an emptyDir: the root is read-only
        assert {"requests", "limits"} <= container["resources"].keys(), name
        if obj["kind"] == "Deployment":
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", name
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", name
            assert "startupProbe" in container, name


def test_the_gpu_overlay_gives_the_learner_group_its_gpus():
    objects = render("gpu")
    (learner,) = [
        o for o in objects if o["metadata"]["name"] == "learner" and o["kind"] == "Deployment"
    ]
    (container,) = learner["spec"]["template"]["spec"]["containers"]
    ranks = int(container["args"][container["args"].index("--nproc") + 1])
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == ranks == 2
    assert container["image"].endswith(":cuda")
    others = [c for o, _, c in containers(objects) if o["metadata"]["name"] != "learner"]
    assert all(not c["image"].endswith(":cuda") for c in others)


def test_compose_runs_what_the_manifests_run():
    """docker-compose.yml and the cpu overlay: the same image, the same command per
    role, the same ports, as many collectors, the same job, and only variables the
    services read."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    objects = render("cpu")
    known = variables_the_services_read()
    manifests = {obj["metadata"]["name"]: (obj, c) for obj, _, c in containers(objects)}
    for role, service in compose.items():
        obj, container = manifests[role]
        image = "drover-coordinator:latest" if role == "coordinator" else "drover:latest"
        assert service["image"] == container["image"] == image, role
        assert service["command"][0] == container["args"][0], role
        env = service["environment"]
        assert {n for n in env if n.startswith("DROVER_")} <= known, role
        if "DROVER_PORT" in env:
            assert env["DROVER_PORT"] == env_of(container)["DROVER_PORT"], role
        if role == "collector":
            assert service["deploy"]["replicas"] == obj["spec"]["replicas"]
    job = (K8S / "base" / "cartpole_dqn.yaml").read_text()
    assert (ROOT / compose["submit"]["command"][1]).read_text() == job


def test_the_manifests_run_only_images_the_build_makes():
    """Each image a manifest names is one the Dockerfile builds: its worker target
    (drover:latest, or drover:cuda with a CUDA torch), its coordinator target."""
    dockerfile = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    assert " AS worker" in dockerfile and " AS coordinator" in dockerfile
    built = {"drover:latest", "drover:cuda", "drover-coordinator:latest"}
    for overlay in ("cpu", "gpu"):
        images = {c["image"] for _, _, c in containers(render(overlay))}
        assert images <= built, (overlay, images - built)
        assert "drover-coordinator:latest" in images and "drover:latest" in images
