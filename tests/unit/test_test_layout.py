"""The test tree's layout: a test module takes what it shares with others from
tests/conftest.py (fixtures), tests/helpers.py and the other modules of tests/ that are
not test modules (tests/fakes.py, ...), never from another test module. Each can then
be read, run and changed alone: no test breaks because another one's module moved."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def module_name(path: Path, root: Path = ROOT) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts)


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every module `path` (under `root`) imports, relative imports resolved; a name
    imported from a package (`from tests.unit import test_x`) counts as the module it
    may be."""
    package = module_name(path, root).rsplit(".", 1)[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[: len(parent) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def is_test_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "tests" and parts[-1].startswith("test_")


def test_no_test_module_imports_another():
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            name
            for name in imported_modules(path)
            if is_test_module(name) and name != module_name(path)
        )
        for path in sorted(TESTS.rglob("test_*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}, (
        "move what they share into tests/helpers.py (functions, constants), "
        "tests/conftest.py (fixtures) or another module of tests/ not named test_*"
    )


def test_the_check_sees_each_way_of_importing_a_test_module(tmp_path):
    folder = tmp_path / "tests" / "unit"
    folder.mkdir(parents=True)
    path = folder / "test_a.py"
    path.write_text(
        "import tests.unit.test_b\n"
        "from tests.unit.test_c import x\n"
        "from tests.unit import test_d\n"
        "from . import test_e\n"
        "from .test_f import y\n"
        "from ..service.test_g import z\n"
        "from tests.helpers import wait_until\n"
        "from tests import fakes\n"
    )
    found = sorted(n for n in imported_modules(path, tmp_path) if is_test_module(n))
    assert found == [
        "tests.service.test_g",
        "tests.unit.test_b",
        "tests.unit.test_c",
        "tests.unit.test_d",
        "tests.unit.test_e",
        "tests.unit.test_f",
    ]
