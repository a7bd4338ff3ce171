"""Layers, bottom up: `common/` (what every part shares, the config's base sections
included), `algorithms/` (each algorithm, its own config sections too), `jobconfig/`
(a job's config resolved: it reads both), then `services/` and `drover/`. No layer
imports one above it, a service imports of another only what `SERVICE_IMPORTS` lets
it (the clients, not the internals), and what the coordinator imports to read configs
imports no torch."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


#: Each package, and the packages above it that it must not import.
ABOVE = {
    "common": ("algorithms", "jobconfig", "services", "drover"),
    "algorithms": ("jobconfig", "services", "drover"),
    "jobconfig": ("services", "drover"),
}


@pytest.mark.parametrize("package", sorted(ABOVE))
def test_no_package_imports_one_above_it(package):
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m for m in imported_modules(path) if m.split(".")[0] in ABOVE[package]
        )
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}


#: What each service may import of the others: a worker (collector, learner, and the
#: slave framework they share) the clients of the coordinator and of the buffer, never
#: their internals; the buffer nothing of any other service; the coordinator the
#: buffer (it starts and supervises buffer processes) and the workers' client.
SERVICE_IMPORTS = {
    "buffer": (),
    "slave": ("services.buffer.client", "services.coordinator.client"),
    "collector": ("services.slave", "services.buffer.client", "services.coordinator.client"),
    "learner": ("services.slave", "services.buffer.client", "services.coordinator.client"),
    "coordinator": ("services.buffer", "services.slave.client"),
}


def test_every_service_package_has_its_rule():
    packages = {p.parent.name for p in (ROOT / "services").glob("*/__init__.py")}
    assert packages == set(SERVICE_IMPORTS)


@pytest.mark.parametrize("service", sorted(SERVICE_IMPORTS))
def test_a_service_imports_only_the_clients_of_the_others(service):
    allowed = SERVICE_IMPORTS[service]
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m
            for m in imported_modules(path)
            if m.startswith("services.")
            and m.split(".")[1] != service
            and not any(m == a or m.startswith(a + ".") for a in allowed)
        )
        for path in sorted((ROOT / "services" / service).rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def run_python(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


@pytest.mark.parametrize("module", ["common.config", "jobconfig", "algorithms.registry"])
def test_reading_configs_imports_no_torch(module):
    assert run_python(f"import sys, {module}; print('torch' in sys.modules)") == "False"


ALGORITHM_PACKAGES = sorted(
    f"algorithms.{path.parent.name}" for path in (ROOT / "algorithms").glob("*/__init__.py")
)


@pytest.mark.parametrize("algorithm", ALGORITHM_PACKAGES)
@pytest.mark.parametrize("first", ["algorithm", "config"])
def test_an_algorithm_and_the_config_import_in_either_order(algorithm, first):
    """An algorithm's `__init__` (which imports common.config at its top, through its
    config module) and `common.config` import in a fresh process whichever comes
    first, and then the job config resolves; a cycle between them would fail here
    with a partially initialized module."""
    order = [algorithm, "common.config"] if first == "algorithm" else ["common.config", algorithm]
    code = "; ".join(f"import {m}" for m in order)
    code += "; from jobconfig import resolve_job_config; resolve_job_config({}); print('ok')"
    assert run_python(code) == "ok"


#: torch.distributed's collectives of Python objects: each pickles what it sends.
PICKLING_COLLECTIVES = (
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
)


def test_no_pickling_collectives_between_ranks():
    """Ranks of a learner group exchange JSON bytes in tensors, never pickles."""
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for package in ("services", "common", "algorithms", "drover")
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in PICKLING_COLLECTIVES
        if name in path.read_text()
    ]
    assert offenders == []
