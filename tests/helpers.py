"""Plain helpers the tests share (fixtures are in tests/conftest.py).

- `wait_until`: the one way a test waits for something, with a deadline;
- real-process clusters (`drover.local.LocalCluster`): the example job, short leases,
  waiting for a job's end, a cluster's invariants at the end of a job;
- one-shot processes (the submit of compose and Kubernetes run as processes);
- Prometheus text as services serve it on `/metrics`;
- the Kubernetes manifests as kustomize renders them, and a DI-engine config file.

Test modules import from here (and from tests/fakes.py and the other non-test modules
of tests/), never from one another: tests/unit/test_test_layout.py checks it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from common.config import deep_merge
from jobconfig import load_config_file

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
#: The default example: DQN on CartPole to a mean return of 195.
EXAMPLE = EXAMPLES / "cartpole_dqn.yaml"
#: How long the example job may take to reach its goal through the services.
DEADLINE_S = 180


# --- waiting --------------------------------------------------------------------------


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float = 10.0,
    what: str | Callable[[], str] = "condition",
    *,
    interval_s: float = 0.01,
    max_interval_s: float = 0.25,
) -> T:
    """Call `predicate` until it returns something truthy, and return that.

    Fails the test (AssertionError) once `timeout_s` have passed, naming `what` it
    waited for; a callable `what` is called then, to say what it saw. The predicate is
    polled every `interval_s` at first, then less often (up to every
    `max_interval_s`): quick conditions are seen at once, and a long wait on a real
    service does not flood it. A predicate may itself fail the test (a service that
    died): its AssertionError goes through.
    """
    deadline = time.monotonic() + timeout_s
    pause = interval_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout_s}s waiting for {said}")
        time.sleep(pause)
        pause = min(max_interval_s, pause * 1.5)


# --- real-process clusters ------------------------------------------------------------

#: The example job, evaluated less often so it outlasts the faults injected into it.
FAULT_TOLERANT_JOB = deep_merge(
    load_config_file(EXAMPLE),
    {
        "policy": {
            "learn": {"checkpoint_every_iters": 100},
            "eval": {"evaluator": {"eval_freq": 3000}},
        }
    },
)
#: Leases short enough (3 s) for tests that kill or stop workers to stay quick.
FAST_LEASES = {
    "DROVER_HEARTBEAT_INTERVAL_S": "0.5",
    "DROVER_LEASE_TIMEOUT_S": "3",
    "DROVER_SCHEDULER_PERIOD_S": "0.2",
    "DROVER_SNAPSHOT_PERIOD_S": "1",
    "DROVER_ORPHAN_GRACE_S": "2",
}


def child_states(pid: int) -> dict[int, str]:
    """The children of `pid` and their states (`Z`: exited, not reaped), from /proc."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rpartition(")")[2].split()[:2]
        except (OSError, ValueError):  # exited while we looked
            continue
        if int(ppid) == pid:
            children[int(stat.parent.name)] = state
    return children


def child_processes(pid: int, needle: str) -> list[int]:
    """The running children of `pid` whose command line holds `needle` (Linux's /proc)."""
    return with_command([c for c, state in child_states(pid).items() if state not in "ZX"], needle)


def buffer_processes(coordinator_pid: int) -> dict[str, int]:
    """The coordinator's buffer processes serving a job, by job id (a buffer process
    works in its job's folder; a spare one, waiting for a job, is left out)."""
    found = {}
    for pid in child_processes(coordinator_pid, "services.buffer"):
        try:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            continue
        if cwd.name.startswith("job-"):
            found[cwd.name] = pid
    return found


def with_command(pids: Iterable[int], needle: str) -> list[int]:
    """Those of `pids` whose command line holds `needle` (Linux's /proc)."""
    found = []
    for pid in pids:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:  # exited while we looked
            continue
        if needle in command:
            found.append(pid)
    return found


def descendants(pid: int) -> set[int]:
    """`pid`'s children, their children and so on, that have not exited (Linux's /proc)."""
    found: set[int] = set()
    parents = [pid]
    while parents:
        children = [c for c, state in child_states(parents.pop()).items() if state not in "ZX"]
        found.update(children)
        parents.extend(children)
    return found


def running(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in "ZX"


def fast_lease_cluster(tmp_path: Path, collectors: int = 2):
    """A local cluster (not started: use `with`) with FAST_LEASES."""
    from drover.local import LocalCluster

    return LocalCluster(tmp_path / "run", num_collectors=collectors, extra_env=FAST_LEASES)


def assert_alive(cluster) -> None:
    """Fail the test, with the end of its log, when a service of `cluster` exited."""
    dead = cluster.dead_services()
    assert not dead, f"{dead[0].name} died:\n{dead[0].log_tail()}"


def wait_for_end(
    cluster,
    job_id: str,
    timeout_s: float = DEADLINE_S,
    *,
    supervise: bool = False,
    max_interval_s: float = 0.25,
):
    """The job's status once it is no longer running (a job runs from its admission
    until it succeeds, fails or is stopped).

    Meanwhile a service that exits fails the test; with `supervise`, it is restarted
    instead (`cluster.supervise()`, what a cluster's restart policy does).
    """

    def ended():
        if supervise:
            cluster.supervise()
        else:
            assert_alive(cluster)
        status = cluster.client.job(job_id)
        return status if status.phase != "running" else None

    return wait_until(
        ended,
        timeout_s,
        lambda: f"job {job_id} to end; it is {cluster.client.job(job_id)}",
        interval_s=0.1,
        max_interval_s=max_interval_s,
    )


def finish(cluster, job_id: str, timeout_s: float = DEADLINE_S):
    """Wait for the job to end, restarting whatever exits meanwhile; it must succeed."""
    status = wait_for_end(cluster, job_id, timeout_s, supervise=True)
    assert status.phase == "succeeded", status
    return status


# --- one-shot processes ---------------------------------------------------------------


def wait_for_success(process: subprocess.Popen, what: str, log_dir: Path, timeout_s: float):
    """Wait (with a deadline) for the one-shot process; it must exit 0. Otherwise the
    failure shows the end of every log in `log_dir`."""
    try:
        code = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in log_dir.glob("*.log"))
    assert code == 0, f"{what} ended with {code}:\n{logs}"


def stop_all(services: list[subprocess.Popen], submit: subprocess.Popen | None) -> None:
    """SIGTERM each service's process group, SIGKILL what is left after 20 s, and kill
    the one-shot process if it still runs."""
    for process in services:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    for process in services:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
    if submit is not None and submit.poll() is None:
        submit.kill()


# --- Prometheus text ------------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, Any]:
    """{family name: family}; fails the test if the text does not parse."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def scrape(url: str, token: str) -> dict[str, Any]:
    """A service's `/metrics`, read with `token` (the metrics secret or the cluster's)."""
    resp = requests.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=5)
    assert resp.status_code == 200, (url, resp.status_code, resp.text[:200])
    assert resp.headers["Content-Type"].startswith("text/plain")
    return parse_metrics(resp.text)


def total(families: dict[str, Any], name: str, **labels: str) -> float:
    """The sum of a family's `_total` (or plain, for gauges) samples matching `labels`."""
    return sum(
        sample.value
        for sample in families[name].samples
        if sample.name in (name, f"{name}_total")
        and all(sample.labels.get(k) == v for k, v in labels.items())
    )


# --- deployment files -----------------------------------------------------------------


def render(overlay: str) -> list[dict]:
    """The objects of a Kubernetes overlay (deploy/k8s/overlays/<overlay>), as
    `kubectl kustomize` renders them."""
    out = subprocess.run(
        ["kubectl", "kustomize", str(ROOT / "deploy" / "k8s" / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


#: A DI-engine PPO config file for CartPole, as DI-engine's users write them.
DI_ENGINE_FILE = textwrap.dedent(
    """
    from easydict import EasyDict

    cartpole_ppo_config = dict(
        exp_name='cartpole_ppo_seed0',
        env=dict(collector_env_num=8, evaluator_env_num=5, n_evaluator_episode=5, stop_value=195),
        policy=dict(
            cuda=False,
            model=dict(obs_shape=4, action_shape=2, encoder_hidden_size_list=[64, 64]),
            learn=dict(epoch_per_collect=2, batch_size=64, learning_rate=0.001),
            collect=dict(n_sample=256, discount_factor=0.9, gae_lambda=0.95),
            eval=dict(evaluator=dict(eval_freq=100)),
        ),
    )
    main_config = EasyDict(cartpole_ppo_config)
    create_config = EasyDict(dict(
        env=dict(type='cartpole', import_names=['dizoo.classic_control.cartpole.envs']),
        env_manager=dict(type='base'),
        policy=dict(type='ppo'),
    ))

    if __name__ == "__main__":
        raise SystemExit("only DI-engine's entry runs this")
    """
)


@contextlib.contextmanager
def tmpfs(root: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (`mount`'s, "1m") mounted at `root` for the block; the test
    is skipped where one cannot be mounted (it needs root)."""
    import pytest

    root.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(root)],
        capture_output=True,
        timeout=10,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], capture_output=True, timeout=10)


def fill(path: Path) -> None:
    """Write zeros to `path` until its volume has no room left (unbuffered: nothing is
    left to flush, and fail, at close)."""
    with open(path, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(bytes(1 << 16))
