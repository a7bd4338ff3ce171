"""A coordinator's memory follows what it holds, not what it ever ran: 1,000 jobs
submitted and ended (each with its buffer host started and stopped) and about 100,000
tasks created and ended leave it within a few tens of MiB of where it started, and so
does a restart that finds them all. Each side runs in a process of its own
(tests/coordinator_memory.py), so RSS is the coordinator's."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.processes

#: Growth allowed for 1,000 ended jobs (a small record each) and the ended tasks
#: remembered (10,000), in MiB; measured here: about 24 (with the jobs' buffer hosts
#: started and stopped in the same process).
GROWTH_BOUND_MIB = 40


def probe(*args):
    out = subprocess.run(
        [sys.executable, "-m", "tests.coordinator_memory", *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_memory_stays_flat_as_jobs_and_tasks_come_and_go_and_after_a_restart(tmp_path):
    run = probe("--shared", str(tmp_path), "--jobs", "1000", "--workers", "101")
    assert run["tasks_created"] >= 100_000, run
    assert run["held"] == {"jobs": 1050, "tasks": 0, "ended_tasks": 10_000}, run
    assert run["rss_end_mib"] - run["rss_warm_mib"] < GROWTH_BOUND_MIB, run

    again = probe("--shared", str(tmp_path), "--restore")
    assert again["restored"] == 1050, again
    # nothing of an ended job's buffer is built again
    assert again["rss_restored_mib"] - again["rss_fresh_mib"] < GROWTH_BOUND_MIB, again
