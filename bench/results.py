"""A bench's headline figures as JSON (`--json PATH`), for bench/headline.py to put
in the README's table: what it measured, its reference, on which machine.

Usage::

    write_figures(args.json, "whole_run", {"drover_s": 6.9, "sb3_s": 8.7, "ratio": 0.79})
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_figures(path: Path | None, bench: str, figures: dict[str, Any]) -> None:
    """Write `figures` (numbers by name) to `path`, with the machine they were
    measured on; nothing when `path` is None."""
    if path is None:
        return
    from bench.learner_scaling import cpu_line

    record = {"bench": bench, "machine": cpu_line(), "figures": figures}
    path.write_text(json.dumps(record, indent=1) + "\n")
