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
    finite = bool(torch.isfinite(loss.detach()))
    if finite:
        loss.backward()
    if sync.world_size > 1:
        owned = [p for group in optimizer.param_groups for p in group["params"]]
        finite = sync.average_gradients(owned, finite)
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
