"""The rendered Kubernetes manifests run as local processes: each container's command
and environment from the cpu overlay, started as the image would start it, with the
Services' host names pointed at 127.0.0.1 ports, the volumes as folders (the
operator's Secret, the job's ConfigMap, the shared PVC) and each replica its own
port. The submit Job's process must exit 0: its training job succeeded. This proves
the wiring (commands, variables, mounts, secrets, the ConfigMap's path), not just
the syntax. Traffic stays on 127.0.0.1; every wait has a deadline."""

import os
import secrets
import shutil
import subprocess
import sys

import pytest

from drover.local import free_port
from tests.helpers import render, stop_all, wait_for_success

pytestmark = [
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed"),
    pytest.mark.processes,
    pytest.mark.learning,
]
JOB_DEADLINE_S = 240


def workloads(objects):
    """(name, replicas, pod spec) of each Deployment and Job, the services first."""
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job"):
            replicas = obj["spec"].get("replicas", 1)
            yield obj["metadata"]["name"], obj["kind"], replicas, obj["spec"]["template"]["spec"]


def local_folders(objects, pod, root):
    """Each of the pod's mount paths as a local folder holding what Kubernetes would
    mount there."""
    config_maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    folders = {}
    for mount in pod["containers"][0].get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "persistentVolumeClaim" in volume:
            folder = root / "pvc" / volume["persistentVolumeClaim"]["claimName"]
        elif "secret" in volume:
            folder = root / "secret" / volume["secret"]["secretName"]
        elif "configMap" in volume:
            folder = root / "configmap" / volume["configMap"]["name"]
            folder.mkdir(parents=True, exist_ok=True)
            for key, text in config_maps[volume["configMap"]["name"]]["data"].items():
                (folder / key).write_text(text)
        else:  # emptyDir
            folder = root / "empty" / f"{mount['name']}-{len(folders)}"
        folder.mkdir(parents=True, exist_ok=True)
        folders[mount["mountPath"]] = folder
    return folders


def localize(value, folders, ports):
    for mount, folder in sorted(folders.items(), key=lambda item: -len(item[0])):
        if value == mount or value.startswith(mount + "/"):
            value = str(folder) + value[len(mount) :]
            break  # once: a local folder may itself lie under a mount path (/tmp)
    for host, port in ports.items():  # a Service's name and port -> 127.0.0.1:port
        value = value.replace(f"http://{host}:8000", f"http://127.0.0.1:{port}")
    return value


def start(container, folders, ports, port, log_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DROVER_")}
    for item in container.get("env", []):
        if "valueFrom" in item:  # the downward API: this "pod's" IP
            env[item["name"]] = "127.0.0.1"
            continue
        env[item["name"]] = localize(item["value"], folders, ports)
    if port is not None:
        env["DROVER_PORT"] = str(port)
        env["DROVER_HOST"] = "127.0.0.1"
        if "DROVER_ADVERTISE_URL" in env:
            env["DROVER_ADVERTISE_URL"] = f"http://127.0.0.1:{port}"
    env["PYTHONSAFEPATH"] = "1"
    args = [localize(arg, folders, ports) for arg in container["args"]]
    # The image's ENTRYPOINT is `drover`.
    return subprocess.Popen(
        [sys.executable, "-m", "drover.cli", *args],
        env=env,
        cwd=folders.get("/shared"),
        stdout=open(log_path, "wb"),  # noqa: SIM115 - the process owns it
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_the_cpu_overlay_trains_the_job_when_run_as_processes(tmp_path):
    objects = render("cpu")
    secret = tmp_path / "secret" / "drover-token"
    secret.mkdir(parents=True)
    (secret / "token").write_text(secrets.token_hex(32))
    (secret / "registration").write_text(secrets.token_hex(32))
    (secret / "metrics").write_text(secrets.token_hex(32))
    ports = {"coordinator": free_port()}
    processes = []
    submit = None
    try:
        for name, kind, replicas, pod in workloads(objects):
            for replica in range(replicas):
                folders = local_folders(objects, pod, tmp_path)
                port = ports.get(name) if name in ports else free_port()
                if kind == "Job":
                    port = None
                log = tmp_path / f"{name}-{replica}.log"
                process = start(pod["containers"][0], folders, ports, port, log)
                if kind == "Job":
                    submit, submit_log = process, log
                else:
                    processes.append(process)
        assert submit is not None, "no submit Job in the manifests"
        wait_for_success(submit, "the submit Job", tmp_path, JOB_DEADLINE_S)
        assert "succeeded" in submit_log.read_text()
    finally:
        stop_all(processes, submit)
