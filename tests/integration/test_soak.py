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


@pytest.mark.timeout(300)
def test_a_short_soak_with_one_restart_and_a_sync_round_sharing_the_collectors(
    tmp_path: Path,
) -> None:
    """Two DQN jobs and a sync PPO job whose rounds need 2 of the 3 collectors at once:
    every job progresses in each minute, through a buffer process's kill and a
    coordinator restart."""
    result = soak(
        tmp_path,
        *("--minutes", "2", "--kills", "1", "--buffer-kills", "1", "--collectors", "3"),
        *("--learners", "2", "--gang"),
        *("--buffer-items", "50000", "--warmup-s", "10", "--churn-s", "2"),
        timeout_s=260,
    )
    assert len(result["recoveries"]) == 2  # the buffer process's, the coordinator's
    assert all(r["lost"] == 0 and r["acknowledged"] > 0 for r in result["recoveries"])
    assert result["errors"] == {}
    assert result["jobs_churned"] >= 10
    assert result["filled_s"] is not None and len(result["rss_by_life"]) >= 2
    # After the restart, the workers it forgot registered again and took tasks.
    assert result["forgotten"] >= 1 and result["tasks_taken"]["collector"] > 3
    # The collectors moved between the jobs by releases, and each job moved on.
    assert result["released"].get("collector", 0) > 0
    first, last = result["progress_by_minute"][0], result["progress_by_minute"][-1]
    assert len(result["main_jobs"]) == 3 and all(last[j] > first[j] > 0 for j in first)


@pytest.mark.long
@pytest.mark.timeout(1200)
def test_the_ten_minute_soak(tmp_path: Path) -> None:
    """The issue's soak: 8 collectors and 2 learners on 1M-item prioritized buffers,
    a job submitted and one stopped every 3 s for 10 minutes, two kill -9 restarts of
    the coordinator and two of a main job's buffer process between them."""
    result = soak(tmp_path, "--minutes", "10", timeout_s=1100)
    assert len(result["recoveries"]) == 4
    assert all(r["lost"] == 0 for r in result["recoveries"])
    assert result["errors"] == {}
    # Each life of 100 s or more (the first ends before the buffers fill).
    assert len(result["rss_by_life"]) >= 4 and result["filled_s"] is not None
    assert all(life["growth_mb"] <= 32 for life in result["rss_by_life"])
