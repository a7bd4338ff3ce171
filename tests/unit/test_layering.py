"""`common/` holds what services share and depends on none of them."""

import ast
from pathlib import Path

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


def test_common_imports_nothing_from_services():
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m for m in imported_modules(path) if m == "services" or m.startswith("services.")
        )
        for path in sorted((ROOT / "common").rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}
