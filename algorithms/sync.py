"""Keeping the ranks of a learner group identical: gradients averaged across ranks.

Every learner steps its optimizers through `algorithms.step.finite_step`, which asks
the learner's `sync` to average the gradients first. A learner in one process has
`LOCAL` (nothing to do); each rank of a learner group (services/learner/group.py)
has an `AllReduceSync` over the group's gradient process group (gloo on CPU, NCCL on
CUDA). Since every rank starts from the same weights and applies the same averaged
gradient, the ranks stay identical without ever sending weights.

The average of the ranks' gradients equals the gradient of one rank on the whole
global batch when each rank's loss is a mean over an equal share of it, which is how
the learner group splits batches.

Usage::

    learner.sync = AllReduceSync(None, group.world_size)   # the default process group
    finite_step(loss, optimizer, params, max_grad_norm, sync=learner.sync)
    adv = learner.sync.normalize(adv)        # PPO: statistics over the global minibatch
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist


class GroupBroken(RuntimeError):
    """A collective across the ranks failed (a rank died, hung past the timeout, or
    the group was torn down): the ranks cannot go on, and must restart together."""


def collective(call: Any, *args: Any, **kwargs: Any) -> Any:
    """`call(*args, **kwargs)`, a torch.distributed operation, with its failure raised
    as `GroupBroken`."""
    try:
        return call(*args, **kwargs)
    except RuntimeError as exc:
        name = getattr(call, "__name__", "a collective")
        raise GroupBroken(f"{name} across the learner group failed: {exc}") from exc


#: What PPO adds to a standard deviation before dividing by it.
NORMALIZE_EPS = 1e-8


class GradientSync(Protocol):
    """How a learner's ranks agree on each update."""

    #: The ranks that train together (1: a learner on its own).
    world_size: int

    def backward(
        self, loss: torch.Tensor, parameters: Sequence[torch.Tensor], finite: bool
    ) -> bool:
        """Backpropagate `loss` (when `finite`: this rank's loss is finite) and leave in
        each of `parameters` the mean of its gradient over the ranks (a missing
        gradient counts as zeros). The answer is whether every rank's loss was finite,
        the same on all of them, so either all ranks step or none does."""
        ...

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        """`values` standardized with the mean and standard deviation of all ranks'
        values together (unchanged when they are one value in all)."""
        ...

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of every rank's `values` (the same shape on all)."""
        ...


class LocalSync:
    """One process: nothing to agree on."""

    world_size = 1

    def backward(
        self, loss: torch.Tensor, parameters: Sequence[torch.Tensor], finite: bool
    ) -> bool:
        if finite:
            loss.backward()
        return finite

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        if len(values) <= 1:
            return values
        return (values - values.mean()) / (values.std() + NORMALIZE_EPS)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return values


LOCAL = LocalSync()

#: Gradient bytes per all-reduce: small enough that the first buckets go out while
#: backward still computes the others, big enough that each message is worth sending.
BUCKET_BYTES = 1 << 20


class AllReduceSync:
    """The ranks of a `torch.distributed` process group, averaging gradients as
    DistributedDataParallel does: the parameters are split into buckets (in reverse,
    the order in which backward produces their gradients), and each bucket's
    all-reduce starts as soon as backward has produced all of its gradients, so
    communication overlaps the rest of backward. Buckets always start in the same
    order on every rank (a bucket waits for the ones before it), so the ranks' collectives
    pair up even when one rank had nothing to backpropagate; a one-number all-reduce
    after them says whether any rank's loss was not finite.

    `wait_s` adds up the time spent waiting for the other ranks after backward (the
    communication backward did not hide).
    """

    def __init__(
        self, group: dist.ProcessGroup | None, world_size: int, bucket_bytes: int = BUCKET_BYTES
    ) -> None:
        self.group = group
        self.world_size = world_size
        self.bucket_bytes = bucket_bytes
        self.wait_s = 0.0
        self._buckets: dict[tuple[int, ...], list[list[torch.Tensor]]] = {}

    def backward(
        self, loss: torch.Tensor, parameters: Sequence[torch.Tensor], finite: bool
    ) -> bool:
        params = list(parameters)
        key = tuple(id(p) for p in params)
        if key not in self._buckets:
            self._buckets[key] = _buckets(params, self.bucket_bytes)
        pending = _Pending(self._buckets[key], self.group)
        if finite:
            hooks = [p.register_post_accumulate_grad_hook(pending.ready) for p in params]
            try:
                loss.backward()
            finally:
                for hook in hooks:
                    hook.remove()
        started = time.perf_counter()
        pending.launch_all()  # those backward did not complete (no gradient, or no backward)
        flag = torch.tensor([0.0 if finite else 1.0])
        collective(dist.all_reduce, flag, group=self.group)
        pending.average_into_grads(self.world_size)
        self.wait_s += time.perf_counter() - started
        return float(flag) == 0.0  # else some rank's loss was NaN or inf: no rank steps

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        count = torch.tensor(float(len(values)), dtype=torch.float64, device=values.device)
        as64 = values.detach().to(torch.float64)
        sums = torch.stack([as64.sum(), (as64 * as64).sum(), count])
        collective(dist.all_reduce, sums, group=self.group)
        total, squares, n = (float(x) for x in sums)
        if n <= 1:
            return values
        mean = total / n
        # Unbiased, as torch.std: the same statistic one rank computes on the whole batch.
        std = (max(squares - n * mean * mean, 0.0) / (n - 1)) ** 0.5
        return (values - mean) / (std + NORMALIZE_EPS)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        total = values.clone()
        collective(dist.all_reduce, total, group=self.group)
        return total


def _buckets(params: list[torch.Tensor], bucket_bytes: int) -> list[list[torch.Tensor]]:
    """`params` in reverse order (the last layers' gradients come first in backward),
    cut into consecutive buckets of about `bucket_bytes`."""
    buckets: list[list[torch.Tensor]] = [[]]
    size = 0
    for param in reversed(params):
        if buckets[-1] and size + param.numel() * param.element_size() > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(param)
        size += param.numel() * param.element_size()
    return buckets


class _Pending:
    """One backward's buckets: which gradients are ready, and the all-reduces started."""

    def __init__(self, buckets: list[list[torch.Tensor]], group: dist.ProcessGroup | None) -> None:
        self.buckets = buckets
        self.group = group
        self.bucket_of = {id(p): i for i, bucket in enumerate(buckets) for p in bucket}
        self.missing = [len(bucket) for bucket in buckets]
        self.started: list[tuple[torch.Tensor, dist.Work]] = []

    def ready(self, param: torch.Tensor) -> None:
        """A parameter's gradient is complete (backward's post-accumulate hook)."""
        self.missing[self.bucket_of[id(param)]] -= 1
        while len(self.started) < len(self.buckets) and self.missing[len(self.started)] == 0:
            self._start(len(self.started))

    def launch_all(self) -> None:
        while len(self.started) < len(self.buckets):
            self._start(len(self.started))

    def _start(self, index: int) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.buckets[index]]
        flat = torch.cat([g.reshape(-1) for g in grads])
        work = collective(dist.all_reduce, flat, group=self.group, async_op=True)
        self.started.append((flat, work))

    def average_into_grads(self, world_size: int) -> None:
        for bucket, (flat, work) in zip(self.buckets, self.started, strict=True):
            collective(work.wait)
            flat /= world_size
            offset = 0
            for param in bucket:
                chunk = flat[offset : offset + param.numel()].view_as(param)
                offset += param.numel()
                if param.grad is None:
                    param.grad = chunk
                else:
                    param.grad.copy_(chunk)
