"""bench/soak.py: a coordinator kept busy while jobs come and go and it is killed and
restarted: its memory stays flat, nothing errs, nothing acknowledged is lost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.processes, pytest.mark.chaos]

ROOT = Path(__file__).resolve().parents[2]


def soak(tmp_path: Path, *args: str, timeout_s: float) -> dict:
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.timeout(240)
def test_a_short_soak_with_one_restart(tmp_path: Path) -> None:
    result = soak(
        tmp_path,
        *("--minutes", "1.5", "--kills", "1", "--collectors", "4", "--learners", "2"),
        *("--buffer-items", "50000", "--warmup-s", "10", "--churn-s", "2"),
        timeout_s=200,
    )
    (recovery,) = result["recoveries"]
    assert recovery["lost"] == 0 and recovery["acknowledged"] > 0
    assert result["errors"] == {}
    assert result["jobs_churned"] >= 10
    assert result["filled_s"] is not None and len(result["rss_by_life"]) == 2
    # After the restart, the workers it forgot registered again and took tasks.
    assert result["forgotten"] >= 1 and result["tasks_taken"]["collector"] > 4


@pytest.mark.long
@pytest.mark.timeout(1200)
def test_the_ten_minute_soak(tmp_path: Path) -> None:
    """The issue's soak: 8 collectors and 2 learners on 1M-item prioritized buffers,
    a job submitted and one stopped every 3 s for 10 minutes, two kill -9 restarts."""
    result = soak(tmp_path, "--minutes", "10", timeout_s=1100)
    assert len(result["recoveries"]) == 2
    assert all(r["lost"] == 0 for r in result["recoveries"])
    assert result["errors"] == {}
    assert len(result["rss_by_life"]) == 3 and result["filled_s"] is not None
    assert all(life["growth_mb"] <= 32 for life in result["rss_by_life"])
