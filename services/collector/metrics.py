"""What a collector counts for Prometheus: `CollectorMetrics`, created once per process
in the service's registry (services/collector/app.py) and handed to its
`CollectorRunner`, whose loops and uploaders count into it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class CollectorMetrics:
    """What a collector counts, in its service's registry (created once per process:
    the counters live as long as it)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.env_steps = Counter(
            "drover_env_steps",
            "Env steps taken by collect tasks (each env of a vector env counts)",
            registry=registry,
        )
        self.segments_written = Counter(
            "drover_segments_written",
            "Segment files written to the shared store",
            registry=registry,
        )
        self.segment_bytes = Counter(
            "drover_segment_bytes",
            "Bytes of segment files written to the shared store",
            registry=registry,
        )
        self.insert_retries = Counter(
            "drover_insert_retries",
            "Segment inserts tried again: rate_limited (429, the learner is behind) or "
            "transient (unreachable, restarting)",
            ["reason"],
            registry=registry,
        )
        for reason in ("rate_limited", "transient"):
            self.insert_retries.labels(reason)  # shown at 0 before the first retry
        self.storage_full_retries = Counter(
            "drover_storage_full_retries",
            "Segment writes tried again because the shared volume had no room (ENOSPC, EDQUOT)",
            registry=registry,
        )
