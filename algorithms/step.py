"""The one optimizer step every learner takes, guarded against non-finite values and,
in a learner group, averaged across its ranks.

A NaN or inf loss from one batch would reach every weight, and the optimizer's
moments, in a single step; such a batch is skipped instead (the caller counts it).
In a learner group the ranks decide together (`algorithms.sync`): a rank whose loss
is not finite makes every rank skip, so the ranks never drift apart.

Usage::

    if not finite_step(loss, optimizer, model.parameters(), max_grad_norm, sync=self.sync):
        self.skipped_updates += 1
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from algorithms.sync import LOCAL, GradientSync


def adam(parameters: Iterable[torch.Tensor], lr: float, eps: float = 1e-8) -> torch.optim.Optimizer:
    """The Adam every learner uses: the fused implementation (one kernel over all the
    weights, CPU and CUDA), several times faster than the per-tensor loop on CPU; the
    optimizer step is work every rank of a learner group does in full."""
    return torch.optim.Adam(parameters, lr=lr, eps=eps, fused=True)


def finite_step(
    loss: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    parameters: Iterable[torch.Tensor] = (),
    max_grad_norm: float | None = None,
    *,
    sync: GradientSync = LOCAL,
) -> bool:
    """Backpropagate `loss` and step `optimizer`, clipping the gradient norm of
    `parameters` when `max_grad_norm` is set; returns False, having changed nothing,
    when the loss (or, when clipping, the gradient norm) is not finite.

    With a `sync` of several ranks, the gradients of every parameter `optimizer`
    updates are averaged across them before clipping, so the clipped norm and the
    step are the same on every rank.
    """
    optimizer.zero_grad(set_to_none=True)
    owned = [p for group in optimizer.param_groups for p in group["params"]]
    finite = sync.backward(loss, owned, bool(torch.isfinite(loss.detach())))
    if not finite:
        optimizer.zero_grad(set_to_none=True)
        return False
    if max_grad_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm)
        if not bool(torch.isfinite(norm)):
            optimizer.zero_grad(set_to_none=True)
            return False
    optimizer.step()
    return True
