"""What Linux's /proc says about another process, for the benches that count the CPU
their services spend."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_s(pid: int) -> float:
    """CPU seconds (user and system) process `pid` has used so far."""
    # The command name in parentheses may hold spaces: the fields follow the last ")".
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
