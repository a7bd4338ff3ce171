"""Running statistics a network normalizes its inputs (or a collector its rewards)
with, kept as the network's buffers so that each published policy version carries the
statistics it acts with, and checkpoints, evaluation and export use them as they are.

The learner updates them from the rows it trained on (`RunningMeanStd.update`), after
training on them: every row of a round was collected, and is trained on, with the
statistics of the version that collected it, which keeps PPO's probability ratios
exact. In a learner group the ranks add up their shares' moments (`sync.sum`), so
every rank holds the same statistics.

Usage::

    norm = RunningMeanStd((obs_dim,), clip=10.0)
    x = norm(obs)                    # (obs - mean) / sqrt(var + eps), clipped
    norm.update(batch_obs, sync)     # after training on the batch
"""

from __future__ import annotations

import torch
from torch import nn

from algorithms.sync import LOCAL, GradientSync

#: What is added to a variance before its square root is divided by.
VARIANCE_EPS = 1e-8
#: The count the statistics start with (mean 0, variance 1): the first batch's moments
#: then weigh all but fully, and a division by a zero count cannot happen.
PRIOR_COUNT = 1e-4


class RunningMeanStd(nn.Module):
    """The mean and variance of every value seen so far (per entry of `shape`), merged
    batch by batch (Chan et al.'s parallel algorithm), in float64."""

    def __init__(self, shape: tuple[int, ...], clip: float | None = None) -> None:
        super().__init__()
        self.clip = clip
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(PRIOR_COUNT, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`x` standardized (and clipped to +-clip), in `x`'s dtype."""
        return self.scale(x - self.mean.to(x.dtype))

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """`x` divided by the standard deviation (not centred), clipped: how rewards are
        scaled by the spread of the discounted return."""
        out = x / torch.sqrt(self.var + VARIANCE_EPS).to(x.dtype)
        return out if self.clip is None else out.clamp(-self.clip, self.clip)

    @torch.no_grad()
    def update(self, batch: torch.Tensor, sync: GradientSync = LOCAL) -> None:
        """Merge the moments of `batch` (rows along its first axis), and of the other
        ranks' batches when `sync` has several, into the statistics."""
        rows = batch.detach().to(self.mean.device, torch.float64).reshape(-1, *self.mean.shape)
        moments = torch.cat(
            [
                torch.tensor([float(len(rows))], dtype=torch.float64, device=rows.device),
                rows.sum(0).reshape(-1),
                (rows * rows).sum(0).reshape(-1),
            ]
        )
        moments = sync.sum(moments)
        count = moments[0]
        if float(count) == 0.0:
            return
        size = self.mean.numel()
        batch_mean = (moments[1 : 1 + size] / count).reshape(self.mean.shape)
        batch_var = (moments[1 + size :] / count).reshape(self.mean.shape) - batch_mean**2
        batch_var = batch_var.clamp(min=0.0)
        total = self.count + count
        delta = batch_mean - self.mean
        merged = self.var * self.count + batch_var * count + delta**2 * self.count * count / total
        self.mean += delta * count / total
        self.var.copy_(merged / total)
        self.count.copy_(total)
