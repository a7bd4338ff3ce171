"""Layers: `common/` holds what services share and `algorithms/` the algorithms; neither
depends on `services/`, and what the coordinator imports to read configs (the config
and the algorithm registry) imports no torch."""

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


@pytest.mark.parametrize("package", ["common", "algorithms"])
def test_imports_nothing_from_services(package):
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m for m in imported_modules(path) if m == "services" or m.startswith("services.")
        )
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_reading_configs_imports_no_torch():
    check = "import sys, common.config; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


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
