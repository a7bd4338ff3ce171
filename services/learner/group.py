"""A learner group: the ranks of one learner, as torch.distributed connects them.

torchrun starts the ranks (`torchrun --nproc-per-node 2 -m services.learner`) and sets
`RANK`, `WORLD_SIZE`, `LOCAL_RANK` and the rendezvous; `RankGroup.join` connects them.
Rank 0 is the aggregator (services/learner/aggregator.py): it alone talks to the
coordinator, and tells the other ranks what to do through `send` / `receive`.

Two process groups, with two timeouts:

- the default group carries the training collectives (gradient all-reduce, the
  per-batch agreement and reports): gloo for CPU tensors, NCCL for CUDA ones, with
  `collective_timeout_s`, so a rank that dies or hangs mid-training is noticed that
  quickly;
- a gloo group carries rank 0's messages, whose timeout also covers rank 0's longest
  wait on the coordinator (a sample long-poll, a publish while the coordinator
  restarts), during which the other ranks wait for the next message.

Messages are JSON bytes in uint8 tensors: torch.distributed's object collectives
pickle, and nothing drover sends between processes is pickled. Any failure of a
collective here or in the gradient all-reduce (`algorithms.sync.collective`: a peer
gone, a timeout) raises `GroupBroken`: the group cannot go on, and its ranks exit so
that torchrun restarts them together. (On CUDA, NCCL's watchdog may abort a rank
whose collective timed out before Python sees an error: the rank exits all the same.)
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from algorithms.sync import GroupBroken, collective
from common.messages import SampledBatch, SampledSegment

log = logging.getLogger(__name__)

#: How long the other ranks wait for rank 0's next message beyond the collective
#: timeout: rank 0 talks to the coordinator only between messages (a sample
#: long-poll: at most 60 s; a publish retried while the coordinator restarts: 60 s).
MESSAGE_SLACK_S = 150.0


@dataclass(frozen=True)
class RankEnv:
    """Where this process stands in its group, as torchrun describes it."""

    rank: int
    world_size: int
    local_rank: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RankEnv | None:
        """This process's rank; None outside a group of two or more ranks."""
        env = os.environ if env is None else env
        world_size = int(env.get("WORLD_SIZE", "1") or 1)
        if world_size <= 1:
            return None
        return cls(
            rank=int(env["RANK"]),
            world_size=world_size,
            local_rank=int(env.get("LOCAL_RANK", "0") or 0),
        )

    def device(self, kind: str) -> torch.device:
        """The device this rank trains a job on: the GPU of its *local* rank (one per
        rank on each machine) for a CUDA job, the CPU otherwise."""
        return torch.device("cuda", self.local_rank) if kind == "cuda" else torch.device("cpu")


class RankGroup:
    """The connected ranks. Usage (rank 0 sends, the others receive)::

    group = RankGroup.join(RankEnv.from_env(), collective_timeout_s=60)
    message = group.send({"kind": "idle"}) if group.rank == 0 else group.receive()
    rows = group.all_min(len(my_rows))
    table = group.all_gather(np.array([loss, samples_per_s]))   # [world, 2]
    """

    def __init__(
        self, ranks: RankEnv, messages: dist.ProcessGroup, *, send_timeout_s: float
    ) -> None:
        self.ranks = ranks
        self.rank = ranks.rank
        self.world_size = ranks.world_size
        self._messages = messages
        self._send_timeout = timedelta(seconds=send_timeout_s)

    @classmethod
    def join(cls, ranks: RankEnv, *, collective_timeout_s: float) -> RankGroup:
        """Connect to the other ranks (torchrun's rendezvous: `MASTER_ADDR`,
        `MASTER_PORT`), blocking until all have joined."""
        cuda = torch.cuda.is_available()
        if cuda and ranks.local_rank < torch.cuda.device_count():
            torch.cuda.set_device(ranks.local_rank)  # NCCL's device for this rank
        backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
        dist.init_process_group(
            backend=backend,
            store=_attempt_store(ranks, collective_timeout_s),
            rank=ranks.rank,
            world_size=ranks.world_size,
            timeout=timedelta(seconds=collective_timeout_s),
        )
        messages = dist.new_group(
            backend="gloo", timeout=timedelta(seconds=collective_timeout_s + MESSAGE_SLACK_S)
        )
        log.info("rank %d of %d joined (%s)", ranks.rank, ranks.world_size, backend)
        return cls(ranks, messages, send_timeout_s=collective_timeout_s)

    def close(self) -> None:
        """Leave the group (a process that ends on its own; a broken group just exits)."""
        if dist.is_initialized():
            dist.destroy_process_group()

    # --- messages from rank 0 ------------------------------------------------------

    def send(self, message: dict[str, Any]) -> dict[str, Any]:
        """Rank 0: send a JSON message to every other rank (returns it)."""
        assert self.rank == 0
        self._broadcast_bytes(json.dumps(message).encode())
        return message

    def receive(self) -> dict[str, Any]:
        """Another rank: the next message rank 0 sends."""
        assert self.rank != 0
        return json.loads(self._broadcast_bytes(b"").decode())

    def _broadcast_bytes(self, data: bytes) -> bytes:
        # A gloo send waits for its receiver: rank 0 gives up after the collective
        # timeout (a hung rank is noticed then), while the others wait for the next
        # message as long as the messages group allows.
        options = dist.BroadcastOptions()
        options.rootRank = 0
        if self.rank == 0:
            options.timeout = self._send_timeout
        try:
            size = torch.tensor([len(data)], dtype=torch.int64)
            self._messages.broadcast([size], options).wait()
            if self.rank == 0:
                payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            else:
                payload = torch.empty(int(size.item()), dtype=torch.uint8)
            self._messages.broadcast([payload], options).wait()
        except RuntimeError as exc:
            raise GroupBroken(f"message from rank 0 failed: {exc}") from exc
        return payload.numpy().tobytes()

    def gather_text(self, text: str) -> list[str]:
        """Every rank's `text`, in rank order (used once, at start: rank devices)."""
        data = text.encode()
        table = self.all_gather(np.frombuffer(data.ljust(256, b"\0")[:256], dtype=np.uint8))
        return [row.astype(np.uint8).tobytes().rstrip(b"\0").decode() for row in table]

    # --- collectives while training --------------------------------------------------

    def all_min(self, value: int) -> int:
        """The smallest `value` of all ranks."""
        tensor = torch.tensor([value], dtype=torch.int64)
        collective(dist.all_reduce, tensor, op=dist.ReduceOp.MIN)
        return int(tensor.item())

    def all_gather(self, values: np.ndarray) -> np.ndarray:
        """Every rank's 1-D `values` (the same length on all), as rows in rank order."""
        mine = torch.as_tensor(np.ascontiguousarray(values, dtype=np.float64))
        rows = [torch.empty_like(mine) for _ in range(self.world_size)]
        collective(dist.all_gather, rows, mine)
        return torch.stack(rows).numpy()

    def broadcast_state(self, state: Any) -> None:
        """Overwrite every tensor in a (nested) state dict with rank 0's, in place: the
        ranks start bitwise identical whatever their own initialization did."""
        for tensor in _tensors(state):
            copy = tensor.detach().to("cpu", copy=True)
            collective(dist.broadcast, copy, src=0)
            with torch.no_grad():
                tensor.copy_(copy)


def _attempt_store(ranks: RankEnv, timeout_s: float) -> dist.Store:
    """The rendezvous store (torchrun's, at `MASTER_ADDR:MASTER_PORT`), with keys of
    this restart attempt only: after torchrun restarts a group, a new rank must never
    read the address a rank of the previous attempt left there (gloo would try to
    connect to a dead process, and the restart fail)."""
    env = os.environ
    agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(
        host_name=env["MASTER_ADDR"],
        port=int(env["MASTER_PORT"]),
        world_size=ranks.world_size,
        is_master=not agent_store and ranks.rank == 0,
        timeout=timedelta(seconds=timeout_s),
    )
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"drover/attempt-{attempt}", store)


def _tensors(state: Any) -> list[torch.Tensor]:
    """The tensors of a nested dict / list, in a fixed order (sorted keys)."""
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, Mapping):
        return [t for key in sorted(state, key=str) for t in _tensors(state[key])]
    if isinstance(state, list | tuple):
        return [t for value in state for t in _tensors(value)]
    return []


def share_bounds(items: int, rank: int, world_size: int) -> tuple[int, int]:
    """The items [start, stop) of a batch of `items` that `rank` trains on: contiguous
    shares whose sizes differ by at most one (equal when `items` splits evenly)."""
    base, extra = divmod(items, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def share_of(batch: SampledBatch, rank: int, world_size: int) -> SampledBatch:
    """The part of a sampled batch that `rank` trains on (its keys, weights, and the
    rows of each segment that fall in its share)."""
    items = len(batch.keys)
    start, stop = share_bounds(items, rank, world_size)
    segments: list[SampledSegment] = []
    first = 0  # the batch position of the current segment's first item
    for segment in batch.segments:
        count = len(segment.rows)
        lo, hi = max(start, first) - first, min(stop, first + count) - first
        if lo < hi:
            lengths = segment.lengths[lo:hi] if segment.lengths is not None else None
            segments.append(
                SampledSegment(path=segment.path, rows=segment.rows[lo:hi], lengths=lengths)
            )
        first += count
    return SampledBatch(
        keys=batch.keys[start:stop], segments=segments, weights=batch.weights[start:stop]
    )
