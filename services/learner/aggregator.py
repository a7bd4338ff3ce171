"""The learner aggregator: a learner group's ranks, acting as one learner.

`torchrun --nproc-per-node N -m services.learner` starts N ranks (`__main__` comes
here when `WORLD_SIZE` > 1). Then:

- **rank 0** is the learner the coordinator sees: it serves the slave routes,
  registers (with the group's world size and each rank's device), holds the lease and
  the credential, and takes learn tasks. For each task it resumes from the newest
  checkpoint and policy, tells the other ranks which files it loaded, and for each
  sample reply sends them the batches. It alone publishes policies, writes
  checkpoints, and sends priorities and progress, merged from every rank's report;
- **ranks 1..N-1** follow (`follow`): they load the same files, read their share of
  each batch from the shared file system and train on it; gradients are averaged
  across all ranks every update (algorithms/sync.py), so the models stay identical.

When a rank dies or hangs, the others' next collective fails (at once, or after
`DROVER_COLLECTIVE_TIMEOUT_S`): rank 0 writes a checkpoint, leaves the coordinator
(its learn task goes back to the job at once) and exits, every rank exits, and
torchrun restarts the group (`--max-restarts`). The new rank 0 registers afresh and
resumes from that checkpoint and the newest published policy: versions keep
increasing and `train_iter` never goes back.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from common.devices import CUDA_DEVICES, local_resources
from common.logs import setup_logging
from common.messages import PolicyRef, SampledBatch, parse
from common.metrics import service_registry
from common.ranks import LEARNER_RANKS, RANK_DEVICES
from common.settings import SettingsError, SlaveSettings, env_float
from common.storage import SharedStore
from jobconfig import algorithm_of, read_job_config, sequence_length_of
from services.learner.core import LearnerRunner
from services.learner.group import GroupBroken, RankEnv, RankGroup
from services.learner.metrics import LearnerMetrics
from services.learner.resume import load_checkpoint, load_policy
from services.learner.segments import SegmentCache, SegmentSchema
from services.learner.training import Trainer, new_learner
from services.slave.core import TaskContext

log = logging.getLogger(__name__)

#: How long a collective may wait for the other ranks before the group is declared
#: broken (a hung rank is noticed after this long).
DEFAULT_COLLECTIVE_TIMEOUT_S = 60.0
COLLECTIVE_TIMEOUT_VAR = "DROVER_COLLECTIVE_TIMEOUT_S"
#: The longest `rank_devices` a registration carries (beyond it: a summary).
MAX_RANK_DEVICES_CHARS = 256
#: The exit code of a rank whose group broke: torchrun restarts the group.
EXIT_GROUP_BROKEN = 75


class AggregatorRunner(LearnerRunner):
    """Rank 0's TaskRunner: a `LearnerRunner` whose every step is also the other
    ranks'. Between tasks it sends them an idle message every `tick_s`, so that they
    never wait for a message longer than the group's timeout."""

    def __init__(
        self,
        store: SharedStore,
        group: RankGroup,
        *,
        tick_s: float,
        metrics: LearnerMetrics | None = None,
    ) -> None:
        super().__init__(store, group, metrics=metrics)
        #: Called with the reason when the group broke; it must not return (exit).
        self.on_broken: Callable[[str], None] = _exit_broken
        self._turn = threading.Lock()  # the task or the ticker talks to the ranks
        self._tick_s = tick_s
        self._ticker = threading.Thread(
            target=self._tick, args=(group,), name="group-ticker", daemon=True
        )
        self._ticker.start()

    def run(self, ctx: TaskContext) -> dict[str, Any]:
        with self._turn:
            try:
                return super().run(ctx)
            except GroupBroken as exc:
                self.on_broken(str(exc))
                raise

    def _tick(self, group: RankGroup) -> None:
        while True:
            time.sleep(self._tick_s)
            with self._turn:
                try:
                    group.send({"kind": "idle"})
                except GroupBroken as exc:
                    self.on_broken(str(exc))
                    return


def follow(group: RankGroup, store: SharedStore) -> None:
    """Ranks 1..N-1: do what rank 0 says, until the group breaks (`GroupBroken`).

    A task that fails here with an ordinary error (a bug, a file that cannot be read)
    is dropped: this rank waits for rank 0's `end`. Where the error strikes every rank
    alike, rank 0 fails the task the same way and sends it, and the group goes on to
    the next task; otherwise rank 0's next collective times out and the group restarts.
    """
    while True:
        message = group.receive()
        if message["kind"] == "task":
            follow_task(group, store, message)


def follow_task(group: RankGroup, store: SharedStore, task: dict[str, Any]) -> None:
    """One learn task as a rank other than 0 runs it, until rank 0's `end`."""
    try:
        _follow_task(group, store, task)
    except GroupBroken:
        raise
    except Exception:
        log.exception("rank %d: the task failed here; waiting for its end", group.rank)
        while group.receive()["kind"] != "end":
            pass


def _follow_task(group: RankGroup, store: SharedStore, task: dict[str, Any]) -> None:
    """One learn task, as a rank other than 0 runs it: the same learner, loaded from the
    same files as rank 0's, trained on this rank's share of every batch."""
    job_id = str(task["job_id"])
    config = read_job_config(store, job_id)
    torch.set_num_threads(config.policy.learn.threads(config.system.torch_num_threads))
    learner = new_learner(config, int(task["seed"]), group)
    if task["checkpoint"] is not None:
        store.resolve(task["checkpoint"], under=f"{job_id}/checkpoints")
        load_checkpoint(store, learner, task["checkpoint"], config.policy.type)
    if task["policy"] is not None:
        load_policy(store, learner, parse(PolicyRef, task["policy"]), config.policy.type)
    group.broadcast_state(learner.state_dict())  # bitwise rank 0's, whatever happened
    schema = SegmentSchema.for_policy(
        config.policy, algorithm_of(config).column_names_for(config.policy)
    )
    cache = SegmentCache(store, job_id, schema, sequence_length=sequence_length_of(config))
    trainer = Trainer(learner, cache, group, takes_sequences=algorithm_of(config).recurrent)
    log.info("rank %d follows task for job %s (%s)", group.rank, job_id, config.policy.type)
    while True:
        message = group.receive()
        kind = message["kind"]
        if kind == "batch":
            trainer.train_batch(parse(SampledBatch, message["batch"]))
        elif kind == "round":
            trainer.train_round(trainer.round_share(parse(SampledBatch, message["batch"])))
        elif kind == "end":
            return


def run_rank(ranks: RankEnv, default_port: int) -> int:
    """The `__main__` of one rank of a learner group."""
    setup_logging(f"learner-rank{ranks.rank}")
    try:
        settings = SlaveSettings.from_env(default_port)
        timeout_s = env_float(os.environ, COLLECTIVE_TIMEOUT_VAR, DEFAULT_COLLECTIVE_TIMEOUT_S)
    except SettingsError as exc:
        print(f"drover learner rank {ranks.rank}: {exc}", file=sys.stderr)
        return 2
    if timeout_s <= 0:
        print(f"drover learner: {COLLECTIVE_TIMEOUT_VAR} must be positive", file=sys.stderr)
        return 2
    group = RankGroup.join(ranks, collective_timeout_s=timeout_s)
    cuda = torch.cuda.is_available() and ranks.local_rank < torch.cuda.device_count()
    devices = group.gather_text(str(ranks.device("cuda" if cuda else "cpu")))
    store = SharedStore(settings.shared_dir)
    if ranks.rank != 0:
        try:
            follow(group, store)
        except GroupBroken as exc:
            log.error("learner group broken (%s): exiting for torchrun to restart it", exc)
        return EXIT_GROUP_BROKEN
    return _serve_rank_zero(group, store, settings, devices, timeout_s)


def _serve_rank_zero(
    group: RankGroup,
    store: SharedStore,
    settings: SlaveSettings,
    devices: list[str],
    timeout_s: float,
) -> int:
    # Imported here: only rank 0 serves HTTP.
    from services.learner.app import create_app
    from services.slave.core import build_slave
    from services.slave.main import serve_slave

    listed = ",".join(devices)
    if len(listed) > MAX_RANK_DEVICES_CHARS:  # a registration's values are short texts
        listed = (
            f"{len(devices)} ranks on {', '.join(sorted(set(d.split(':')[0] for d in devices)))}"
        )
    resources: dict[str, Any] = {
        **local_resources(),
        LEARNER_RANKS: group.world_size,
        RANK_DEVICES: listed,
        # A CUDA job needs a GPU on every rank.
        CUDA_DEVICES: len(devices) if all(d.startswith("cuda") for d in devices) else 0,
    }
    registry = service_registry()
    runner = AggregatorRunner(
        store, group, tick_s=min(5.0, timeout_s / 4), metrics=LearnerMetrics(registry)
    )
    slave = build_slave("learner", runner, settings, resources=resources, metrics=registry)

    def broken(reason: str) -> None:
        log.error(
            "learner group broken (%s): leaving the coordinator and exiting for torchrun "
            "to restart the group",
            reason,
        )
        if slave.worker_id is not None:
            try:  # its learn task goes back to the job at once, not at lease expiry
                slave.coordinator.leave(slave.worker_id)
            except Exception as exc:  # noqa: BLE001 - exiting either way
                log.warning("could not leave the coordinator: %s", exc)
        _exit_broken(reason)

    runner.on_broken = broken
    app = create_app(settings, core=slave)
    log.info("learner group of %d ranks on %s", group.world_size, ", ".join(devices))
    serve_slave(app, settings)
    return 0


def _exit_broken(reason: str) -> None:
    logging.shutdown()
    os._exit(EXIT_GROUP_BROKEN)  # threads may be blocked in collectives: no joining
