"""bench/fleet.py: its smoke run measures a real coordinator under a tiny fleet, and the
segments its collectors insert are of the job's schema."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.fleet import SEGMENT_ROWS, SEGMENTS_PER_INSERT, job_config, parse_args, transitions
from common.config import to_dict
from common.messages import SegmentRef, dump
from common.storage import SharedStore
from jobconfig import algorithm_of, fit_to_env, resolve_job_config
from services.learner.segments import SegmentSchema

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.processes
def test_fleet_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fleet.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"│\s+2\s+│\s+1\s+│", proc.stdout), proc.stdout  # the table's row
    (row,) = json.loads(out.read_text())
    assert (row["collectors"], row["learners"], row["jobs"]) == (2, 1, 1)
    assert row["tasks"] == {"collect": 2, "learn": 1}
    assert row["errors"] == {}, row["errors"]
    # 2 collectors writing 20 segments/s for 2 s: at most 80 (and one more each for its
    # phase); an insert carries every segment ready and unsent, up to the collector's cap.
    inserts = len(row["insert_ms"])
    segments = sum(row["segments_per_insert"])
    assert len(row["segments_per_insert"]) == inserts
    assert all(1 <= n <= SEGMENTS_PER_INSERT for n in row["segments_per_insert"])
    assert 0 < inserts <= segments <= 82
    assert row["rows_indexed"] == SEGMENT_ROWS * segments  # every segment a new one
    assert row["segments_per_s"] == segments / 2.0
    assert row["duplicates"] == 0 and row["ran_out"] == 0
    assert row["transitions_per_s"] == row["rows_indexed"] / 2.0
    assert row["sample_ms"] and row["data_plane_cpu_ms_per_round"] > 0
    assert row["samples_per_s"] == len(row["sample_ms"]) / 2.0
    assert all(x > 0 for x in row["insert_ms"] + row["sample_ms"])
    assert row["heartbeats"] > 0
    assert 0 < row["data_plane_cpu_share"] <= (os.cpu_count() or 1)
    assert row["data_plane_cpu_ms_per_1k"] > 0
    assert row["data_plane_rss_mb"] > 10
    assert row["buffer_processes"] == 1  # the job's, whose CPU is counted
    assert row["generator_cpu_share"] > 0


def test_fleet_segments_have_the_jobs_schema(tmp_path: Path) -> None:
    """What a simulated collector writes passes the learner's checks, with the header
    a real collector gives it."""
    args = parse_args(["--quick"])
    config = fit_to_env(resolve_job_config(job_config(args, 2))[0])
    columns = transitions(to_dict(config)["policy"], SEGMENT_ROWS, seed=0)
    schema = SegmentSchema.for_policy(
        config.policy, algorithm_of(config).column_names_for(config.policy)
    )
    checked = schema.check(columns)
    assert all(len(column) == SEGMENT_ROWS for column in checked.values())
    store = SharedStore(tmp_path)
    ref = SegmentRef(
        path=store.segment_path("job-1", "w.t", 0),
        rows=SEGMENT_ROWS,
        env_steps=64,
        policy_version=0,
    )
    store.write_segment(ref.path, columns, header=dump(ref))
    assert store.segment_rows(ref.path) == SEGMENT_ROWS
    assert store.read_segment_header(ref.path) == dump(ref)
    schema.check(store.read_segment(ref.path))
