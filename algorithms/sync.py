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

    learner.sync = AllReduceSync(group.gradients, group.world_size)
    finite_step(loss, optimizer, params, max_grad_norm, sync=learner.sync)
    adv = learner.sync.normalize(adv)        # PPO: statistics over the global minibatch
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
import torch.distributed as dist

#: What PPO adds to a standard deviation before dividing by it.
NORMALIZE_EPS = 1e-8


class GradientSync(Protocol):
    """How a learner's ranks agree on each update."""

    #: The ranks that train together (1: a learner on its own).
    world_size: int

    def average_gradients(self, parameters: Sequence[torch.Tensor], finite: bool) -> bool:
        """Replace each parameter's gradient with its mean over the ranks (a missing
        gradient counts as zeros). `finite` says whether this rank's loss was finite;
        the answer is whether every rank's was, the same on all of them, so either all
        ranks step or none does."""
        ...

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        """`values` standardized with the mean and standard deviation of all ranks'
        values together (unchanged when they are one value in all)."""
        ...


class LocalSync:
    """One process: nothing to agree on."""

    world_size = 1

    def average_gradients(self, parameters: Sequence[torch.Tensor], finite: bool) -> bool:
        return finite

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        if len(values) <= 1:
            return values
        return (values - values.mean()) / (values.std() + NORMALIZE_EPS)


LOCAL = LocalSync()


class AllReduceSync:
    """The ranks of a `torch.distributed` process group: one all-reduce per optimizer
    step, of every gradient flattened into one buffer (one message, not one per
    tensor), with a flag for a rank whose loss was not finite appended to it."""

    def __init__(self, group: dist.ProcessGroup | None, world_size: int) -> None:
        self.group = group
        self.world_size = world_size

    def average_gradients(self, parameters: Sequence[torch.Tensor], finite: bool) -> bool:
        params = list(parameters)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flag = torch.zeros(1, dtype=grads[0].dtype, device=grads[0].device)
        if not finite:
            flag += 1
        flat = torch.cat([g.reshape(-1) for g in grads] + [flag])
        dist.all_reduce(flat, group=self.group)
        if float(flat[-1]) > 0:  # some rank's loss was NaN or inf: no rank steps
            return False
        flat /= self.world_size
        offset = 0
        for param, grad in zip(params, grads, strict=True):
            chunk = flat[offset : offset + grad.numel()].view_as(grad)
            offset += grad.numel()
            if param.grad is None:
                param.grad = chunk.clone()
            else:
                param.grad.copy_(chunk)
        return True

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        count = torch.tensor(float(len(values)), dtype=torch.float64, device=values.device)
        as64 = values.detach().to(torch.float64)
        sums = torch.stack([as64.sum(), (as64 * as64).sum(), count])
        dist.all_reduce(sums, group=self.group)
        total, squares, n = (float(x) for x in sums)
        if n <= 1:
            return values
        mean = total / n
        # Unbiased, as torch.std: the same statistic one rank computes on the whole batch.
        std = (max(squares - n * mean * mean, 0.0) / (n - 1)) ** 0.5
        return (values - mean) / (std + NORMALIZE_EPS)
