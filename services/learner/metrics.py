"""What a learner counts for Prometheus: `LearnerMetrics`, created once per process in
the service's registry (services/learner/app.py, a learner group's rank 0) and handed
to its `LearnerRunner`, whose sessions count into it."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge

#: What torchrun sets in a learner group's ranks: how many times it restarted the group.
RESTART_COUNT_VAR = "TORCHELASTIC_RESTART_COUNT"


class LearnerMetrics:
    """What a learner counts, in its service's registry (created once per process:
    the counters live as long as it)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.train_iterations = Counter(
            "drover_train_iterations",
            "Training iterations run (the learner's train_iter steps)",
            registry=registry,
        )
        self.policy_version = Gauge(
            "drover_policy_version",
            "The policy version this learner last published",
            registry=registry,
        )
        self.publishes = Counter(
            "drover_policy_publishes",
            "Policy versions written and announced",
            registry=registry,
        )
        self.checkpoints = Counter(
            "drover_checkpoint_writes",
            "Checkpoints written",
            registry=registry,
        )
        self.checkpoint_bytes = Counter(
            "drover_checkpoint_bytes",
            "Bytes of checkpoints written",
            registry=registry,
        )
        restarts = Gauge(
            "drover_learner_group_restarts",
            f"Times torchrun restarted this learner group ({RESTART_COUNT_VAR}; 0 outside one)",
            registry=registry,
        )
        try:
            restarts.set(int(os.environ.get(RESTART_COUNT_VAR, "0")))
        except ValueError:
            restarts.set(0)
