"""bench/scaling.py on a tiny budget: both algorithms on the slow env with 1 and 2
collectors, a few thousand env steps each, and every figure of its table and files
there and sane; and the slow env itself."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest

ROOT = Path(__file__).resolve().parents[2]
BUDGET = 5000  # PPO: 3 rounds, its first evaluated version after the 2nd


def test_slow_env_steps_take_their_wall_time() -> None:
    from bench.slow_env import ENV_ID

    env = gym.make(ENV_ID, step_ms=5)
    env.reset(seed=0)
    started = time.monotonic()
    for _ in range(4):
        _, _, terminated, truncated, _ = env.step(0)
        if terminated or truncated:
            env.reset()
    assert time.monotonic() - started >= 4 * 0.005
    assert env.spec is not None and env.spec.max_episode_steps == 500


@pytest.mark.processes
@pytest.mark.smoke
@pytest.mark.timeout(300)
def test_scaling_bench_runs_both_algorithms_at_two_collector_counts(tmp_path: Path) -> None:
    out, figures = tmp_path / "out", tmp_path / "figures.json"
    command = [sys.executable, str(ROOT / "bench" / "scaling.py"), "--algos", "dqn,ppo"]
    command += ["--collectors", "1,2", "--seeds", "1", "--step-ms", "1"]
    command += ["--max-env-step", str(BUDGET), "--timeout-s", "60", "--eval-every-s", "0.2"]
    command += ["--out", str(out), "--json", str(figures)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    runs = json.loads((out / "runs.json").read_text())
    assert [(r["algo"], r["collectors"]) for r in runs] == [
        ("dqn", 1),
        ("dqn", 2),
        ("ppo", 1),
        ("ppo", 2),
    ]
    for run in runs:
        assert run["watch_error"] == "", run
        assert run["versions_evaluated"] >= 1, run  # the bench saw the learner's versions
        # Ended at the goal (the bench stopped it) or at the budget, within the time limit.
        assert run["phase"] in ("stopped", "failed"), run
        assert run["reached"] or run["env_steps"] >= BUDGET, run
        assert run["env_steps"] > 0 and 0 < run["wall_s"] < 60, run
        assert run["env_steps_per_s"] > 0, run
        assert run["learner_busy"] is None or 0.0 <= run["learner_busy"] <= 1.0, run
        for key in ("data_plane_cpu", "collectors_cpu", "learner_cpu", "machine_cpu"):
            assert 0.0 < run[key] < 2 * 64, (key, run)
        # Env steps only grow, read after read.
        counts = [n for _, n in run["steps"]]
        assert counts == sorted(counts), run["steps"]

    table = (out / "scaling.md").read_text()
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    assert [(r[0].strip("| "), r[1]) for r in rows] == [
        ("dqn", "1"),
        ("", "2"),
        ("ppo", "1"),
        ("", "2"),
    ], table
    assert rows[0][4] == "1.00" and rows[2][4] == "1.00", table  # efficiency at 1 collector
    assert "dqn" in proc.stdout and "efficiency" in proc.stdout  # the printed table
    assert (out / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The headline's figures (bench/headline.py): 2 collectors against 1, per algorithm.
    record = json.loads(figures.read_text())
    assert record["bench"] == "scaling"
    dqn, ppo = record["figures"]["dqn"], record["figures"]["ppo"]
    assert (dqn["workflow"], ppo["workflow"]) == ("async", "sync")
    assert dqn["collectors"] == ppo["collectors"] == 2
    assert dqn["by_collectors"]["1"]["efficiency"] == pytest.approx(1.0)
    assert dqn["efficiency"] > 0 and ppo["efficiency"] > 0
