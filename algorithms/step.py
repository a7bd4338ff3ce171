"""The one optimizer step every learner takes, guarded against non-finite values.

A NaN or inf loss from one batch would reach every weight, and the optimizer's
moments, in a single step; such a batch is skipped instead (the caller counts it).

Usage::

    if not finite_step(loss, optimizer, model.parameters(), max_grad_norm):
        self.skipped_updates += 1
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def finite_step(
    loss: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    parameters: Iterable[torch.Tensor] = (),
    max_grad_norm: float | None = None,
) -> bool:
    """Backpropagate `loss` and step `optimizer`, clipping the gradient norm of
    `parameters` when `max_grad_norm` is set; returns False, having changed nothing,
    when the loss (or, when clipping, the gradient norm) is not finite."""
    optimizer.zero_grad(set_to_none=True)
    if not bool(torch.isfinite(loss.detach())):
        return False
    loss.backward()
    if max_grad_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm)
        if not bool(torch.isfinite(norm)):
            optimizer.zero_grad(set_to_none=True)
            return False
    optimizer.step()
    return True
