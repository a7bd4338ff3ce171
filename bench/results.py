"""A bench's headline figures as JSON (`--json PATH`), for bench/headline.py to put
in the README's table: what it measured, its reference, on which machine.

Usage::

    write_figures(args.json, "whole_run", {"drover_s": 6.9, "sb3_s": 8.7, "ratio": 0.79})
"""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path
from typing import Any


def write_figures(
    path: Path | None, bench: str, figures: dict[str, Any], *, commit: str | None = None
) -> None:
    """Write `figures` (numbers by name) to `path`, with the machine they were
    measured on, the commit (`commit`: the one the bench started at, for a bench
    longer than a commit; else the checkout's now) and the date; nothing when `path`
    is None."""
    if path is None:
        return
    from bench.learner_scaling import cpu_line

    record = {
        "bench": bench,
        "machine": cpu_line(),
        "commit": commit or checkout_commit(),
        "date": datetime.date.today().isoformat(),
        "figures": figures,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")


def checkout_commit() -> str:
    """The checkout's commit (with `+` when its tracked files differ from it)."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--"], cwd=root, timeout=30
        ).returncode
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+" if dirty else "")
