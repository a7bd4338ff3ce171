"""The coordinator's Prometheus metrics: counters its parts bump as things happen
(created once, for the process's lifetime) and the per-job gauges, read from the
coordinator's state at each scrape."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.metrics import LATENCY_BUCKETS_S


class CoordinatorMetrics:
    """What the coordinator counts, in `registry` (one per coordinator)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.samples_served = Counter(
            "drover_samples_served",
            "Replay items handed to learners in sample replies",
            ["job_id"],
            registry=registry,
        )
        self.sample_wait = Histogram(
            "drover_sample_wait_seconds",
            "Time a sample request waited in the buffer for data (its long-poll)",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.sample_timeouts = Counter(
            "drover_sample_timeouts",
            "Sample long-polls that ended with no data (503 sample_timeout)",
            ["job_id"],
            registry=registry,
        )
        self.segments_inserted = Counter(
            "drover_segments_inserted",
            "Segments newly indexed into a job's buffer (duplicates not counted)",
            ["job_id"],
            registry=registry,
        )
        self.inserts_rate_limited = Counter(
            "drover_inserts_rate_limited",
            "Segment inserts answered 429: the rate limiter made the collector wait",
            ["job_id"],
            registry=registry,
        )
        self.inserts_busy = Counter(
            "drover_inserts_busy",
            "Segment inserts answered 429 busy: max_concurrent_inserts were being indexed",
            registry=registry,
        )
        self.lease_expiries = Counter(
            "drover_lease_expiries",
            "Workers dropped for missing their heartbeats",
            ["role"],
            registry=registry,
        )
        self.tasks_assigned = Counter(
            "drover_tasks_assigned",
            "Tasks planned for a worker",
            ["kind"],
            registry=registry,
        )
        self.tasks_released = Counter(
            "drover_tasks_released",
            "Tasks released so that their worker goes to another job (fair shares, priorities)",
            ["kind"],
            registry=registry,
        )
        self.tasks_ended = Counter(
            "drover_tasks_ended",
            "Tasks ended, by how: done, failed, cancelled, or lost (planned again)",
            ["kind", "state"],
            registry=registry,
        )
        self.tasks_lost_by_worker = Counter(
            "drover_tasks_lost_by_worker",
            "Tasks a live worker lost (never confirmed, or missing from its heartbeats): "
            "it is held back",
            ["kind"],
            registry=registry,
        )

    def forget_job(self, job_id: str) -> None:
        """Remove a forgotten job's series (a scrape no longer shows them)."""
        for counter in (
            self.samples_served,
            self.sample_timeouts,
            self.segments_inserted,
            self.inserts_rate_limited,
        ):
            with contextlib.suppress(KeyError):  # never counted for this job
                counter.remove(job_id)


class JobGauges(Collector):
    """The per-job gauges and the worker count, read at each scrape.

    Args:
        read: returns (job statuses, buffer sizes by job id, registered workers);
            it takes the coordinator's lock, as any reader does.
    """

    def __init__(self, read: Callable[[], tuple[list[Any], dict[str, int], int]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        jobs, sizes, workers = self.read()
        gauges = {
            name: GaugeMetricFamily(f"drover_job_{name}", help_text, labels=["job_id"])
            for name, help_text in (
                ("env_steps", "Env steps collected"),
                ("train_iters", "Learner iterations"),
                ("policy_version", "Newest policy version"),
                ("buffer_size", "Items in the replay buffer"),
                ("collectors_owed", "Collectors a running job is owed now (its fair share)"),
                ("collectors_held", "Collectors a running job holds now"),
                ("learners_owed", "Learners a running job is owed now (its fair share)"),
                ("learners_held", "Learners a running job holds now"),
                ("queue_position", "A queued job's place in the queue (1: next to run)"),
                ("priority", "A running or queued job's system.priority"),
                ("tasks_preempted", "Tasks of a job released so their worker went to another"),
                (
                    "train_iters_since_eval",
                    "Train iterations since those of a running training job's last "
                    "evaluated policy (its evaluations stall when it grows past eval_freq)",
                ),
                (
                    "storage_full_seconds",
                    "Seconds a running job's writes have waited for room on the shared "
                    "volume without progress (0: they have room)",
                ),
            )
        }
        for status in jobs:
            job_id = [status.job_id]
            gauges["env_steps"].add_metric(job_id, status.env_steps)
            gauges["train_iters"].add_metric(job_id, status.train_iters)
            gauges["policy_version"].add_metric(job_id, status.policy_version)
            gauges["buffer_size"].add_metric(job_id, sizes.get(status.job_id, 0))
            gauges["tasks_preempted"].add_metric(job_id, status.tasks_preempted)
            if status.phase == "running" and status.train_iters_since_eval is not None:
                gauges["train_iters_since_eval"].add_metric(job_id, status.train_iters_since_eval)
            if status.phase == "running":
                gauges["storage_full_seconds"].add_metric(job_id, status.storage_full_s or 0.0)
            if status.phase in ("running", "queued"):
                gauges["priority"].add_metric(job_id, status.priority)
            if status.queue_position is not None:
                gauges["queue_position"].add_metric(job_id, status.queue_position)
            for role, share in (
                ("collectors", status.collector_share),
                ("learners", status.learner_share),
            ):
                if share is not None:
                    gauges[f"{role}_owed"].add_metric(job_id, share.owed)
                    gauges[f"{role}_held"].add_metric(job_id, share.held)
        yield from gauges.values()
        yield GaugeMetricFamily("drover_workers", "Registered workers", value=workers)
