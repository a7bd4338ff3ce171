"""A library file over 600 lines says, at its top, why it is one piece ("One module on
purpose" or "One class in one module on purpose" in its docstring), or is split: a
newcomer opening a long file learns first whether its length is a choice."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("common", "algorithms", "jobconfig", "services", "drover")
MAX_LINES = 600


def test_a_long_library_file_says_why_it_is_one_piece():
    unexplained = []
    for package in LIBRARY:
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text()
            if text.count("\n") <= MAX_LINES:
                continue
            doc = ast.get_docstring(ast.parse(text)) or ""
            if "on purpose" not in doc:
                unexplained.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert unexplained == [], f"over {MAX_LINES} lines without saying why: {unexplained}"
